# SPDX-License-Identifier: Apache-2.0
"""PyTorch I-BERT: BERT whose position embeddings are replaced by a bidirectional LSTM, after Nam et al. (2020),
"I-BERT: Inductive Generalization of Transformer to Arbitrary Context Lengths".

Not transformers' Integer-BERT (`transformers.IBertForMaskedLM`, model type "ibert"): the classes here share its
class names only. Attention layers, pooler and heads are transformers' own BERT modules, under BERT's submodule
names, so a BERT checkpoint loads with only the LSTM weights missing."""

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    MaskedLMOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.models.bert.modeling_bert import (
    BertAttention,
    BertLayer,
    BertLMPredictionHead,
    BertOnlyMLMHead,
    BertPooler,
    BertSelfAttention,
)
from transformers.utils.generic import can_return_tuple
from transformers.utils.output_capturing import capture_outputs

from .configuration_inductive_bert import InductiveBertConfig


def bidirectional_lstm(lstm: nn.LSTM, hidden_states: torch.Tensor, padding_mask: torch.Tensor | None) -> torch.Tensor:
    """Run a batch-first bidirectional `lstm` over each row's real tokens only.

    Padding may sit anywhere (left, right, in between): each row's real tokens are gathered to the left in their
    order, packed to their count and run, and scattered back, so padding never changes a real token's output.
    Padding positions get zeros.

    hidden_states: (batch, seq, hidden). padding_mask: (batch, seq), nonzero for real tokens, or None (no padding).
    Returns (batch, seq, 2 * lstm.hidden_size).
    """
    if padding_mask is None:
        return lstm(hidden_states)[0]
    if torch.compiler.is_exporting() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
        # Whether and how to pack is decided from the mask's values in Python: a trace would keep the example's
        # decision and be silently wrong for other padding.
        raise RuntimeError(
            "I-BERT's LSTM cannot be exported or traced with an attention_mask (torch.export, torch.onnx.export, "
            "torch.jit.trace): it packs each row to its real tokens from the mask's values, so a graph would hold "
            "one input's padding. Export without attention_mask (unpadded inputs), or run eagerly or under "
            "torch.compile"
        )
    real = padding_mask.bool()  # (batch, seq)
    if bool(real.all()):
        return lstm(hidden_states)[0]
    # Positions of real tokens first, each group in its original order.
    order = torch.argsort((~real).to(torch.int8), dim=1, stable=True)  # (batch, seq)
    gathered = hidden_states.gather(1, order.unsqueeze(-1).expand_as(hidden_states))
    # pack_padded_sequence rejects empty rows; an all-padding row runs on one token whose output is zeroed below.
    lengths = real.sum(dim=1).clamp(min=1).cpu()
    packed = pack_padded_sequence(gathered, lengths, batch_first=True, enforce_sorted=False)
    output, _ = pad_packed_sequence(lstm(packed)[0], batch_first=True, total_length=hidden_states.shape[1])
    index = order.unsqueeze(-1).expand(*order.shape, output.shape[-1])
    output = torch.zeros_like(output).scatter(1, index, output)  # (batch, seq, 2 * lstm.hidden_size)
    return output * real.unsqueeze(-1).to(output.dtype)


def new_bidirectional_lstm(config: InductiveBertConfig) -> nn.LSTM:
    """hidden_size inputs, hidden_size / 2 units per direction, so the concatenated output is hidden_size wide."""
    return nn.LSTM(config.hidden_size, config.hidden_size // 2, batch_first=True, bidirectional=True)


def unused_bert_weight_patterns(config: InductiveBertConfig) -> list[str]:
    """Regexes of BERT checkpoint tensors this configuration has no place for (dropped without a warning)."""
    # Old checkpoints still store the position_ids buffer.
    patterns = [r"embeddings\.position_ids$"]
    if not config.use_position_embeddings:
        patterns.append(r"embeddings\.position_embeddings\.")
    if config.lstm_feed_forward:
        patterns += [r"encoder\.layer\.\d+\.intermediate\.", r"encoder\.layer\.\d+\.output\.dense\."]
    return patterns


def classifier_dropout(config: InductiveBertConfig) -> float:
    """BERT's rule: `classifier_dropout`, falling back to `hidden_dropout_prob`."""
    return config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob


class IBertEmbeddings(nn.Module):
    """Word and token-type embeddings read by a BiLSTM, then (I-BERT+PE only) position embeddings, LayerNorm and
    dropout.

    The order follows the authors' implementation: embedding -> LSTM -> LayerNorm -> encoder, with no residual
    connection around the LSTM. BERT's embedding LayerNorm keeps its role of normalising the encoder's input.
    """

    def __init__(self, config: InductiveBertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.lstm = new_bidirectional_lstm(config)
        if config.use_position_embeddings:
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)  # (batch, seq, hidden)
        if token_type_ids is None:
            token_type_ids = torch.zeros(inputs_embeds.shape[:2], dtype=torch.long, device=inputs_embeds.device)
        embeddings = inputs_embeds + self.token_type_embeddings(token_type_ids)
        embeddings = bidirectional_lstm(self.lstm, embeddings, padding_mask)  # (batch, seq, hidden)
        if hasattr(self, "position_embeddings"):
            embeddings = embeddings + self.position_embeddings(self._position_ids(embeddings, position_ids))
        elif position_ids is not None:
            raise ValueError(
                "position_ids were given, but this I-BERT has no position embeddings (use_position_embeddings=False)"
            )
        return self.dropout(self.LayerNorm(embeddings))

    def _position_ids(self, embeddings: torch.Tensor, position_ids: torch.LongTensor | None) -> torch.LongTensor:
        seq_length = embeddings.shape[1]
        if position_ids is None:
            num_positions = self.position_embeddings.num_embeddings
            if seq_length > num_positions:
                raise ValueError(
                    f"An input of {seq_length} tokens exceeds max_position_embeddings={num_positions}, the "
                    "position table of use_position_embeddings=True"
                )
            position_ids = torch.arange(seq_length, device=embeddings.device).unsqueeze(0)  # (1, seq)
        return position_ids


class IBertLSTMOutput(nn.Module):
    """I-BERT2's feed-forward replacement: BiLSTM, dropout, residual connection and LayerNorm (named as BERT's
    `output` block, so BERT's output LayerNorm loads into it)."""

    def __init__(self, config: InductiveBertConfig):
        super().__init__()
        self.lstm = new_bidirectional_lstm(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor, padding_mask: torch.Tensor | None) -> torch.Tensor:
        recurrent = self.dropout(bidirectional_lstm(self.lstm, hidden_states, padding_mask))
        return self.LayerNorm(recurrent + hidden_states)  # (batch, seq, hidden)


class IBertLSTMLayer(GradientCheckpointingLayer):
    """I-BERT2 encoder layer: BERT's self-attention block, then a BiLSTM in place of the feed-forward network
    (paper §6.2: "every feed-forward layer is replaced by an LSTM layer")."""

    def __init__(self, config: InductiveBertConfig, layer_idx: int | None = None):
        super().__init__()
        self.attention = BertAttention(config, layer_idx=layer_idx)
        self.output = IBertLSTMOutput(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        attention_output, _ = self.attention(hidden_states, attention_mask, **kwargs)
        return self.output(attention_output, padding_mask)


class IBertEncoder(nn.Module):
    """BERT's layer stack (transformers' `BertLayer`), or I-BERT2's `IBertLSTMLayer`s with `lstm_feed_forward`."""

    # Adapted from transformers.models.bert.modeling_bert.BertEncoder (v5.23), encoder-only.
    def __init__(self, config: InductiveBertConfig):
        super().__init__()
        self.config = config
        layer_class = IBertLSTMLayer if config.lstm_feed_forward else BertLayer
        self.layer = nn.ModuleList([layer_class(config, layer_idx=i) for i in range(config.num_hidden_layers)])

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        # Only I-BERT2's LSTM layers need the 2-D mask; BertLayer would pass it on to the attention function.
        if self.config.lstm_feed_forward:
            kwargs["padding_mask"] = padding_mask
        for layer_module in self.layer:
            hidden_states = layer_module(hidden_states, attention_mask, **kwargs)
        return hidden_states  # (batch, seq, hidden)


class IBertPreTrainedModel(PreTrainedModel):
    config_class = InductiveBertConfig
    base_model_prefix = "bert"
    supports_gradient_checkpointing = True
    # Not the embeddings (BERT lists them): the masked-LM head is tied to their word embeddings, and FSDP2 refuses a
    # weight that two of its units hold (the embeddings' unit and the head's, or the root's).
    _no_split_modules = ["BertLayer"]
    _supports_sdpa = True
    _supports_attention_backend = True
    _can_record_outputs = {"hidden_states": [BertLayer, IBertLSTMLayer], "attentions": BertSelfAttention}

    def __init__(self, config: InductiveBertConfig, *inputs, **kwargs):
        super().__init__(config, *inputs, **kwargs)
        config.check_inductive_bert_settings()
        self._keys_to_ignore_on_load_unexpected = unused_bert_weight_patterns(config)
        # Only the layer class this configuration builds: accelerate's TRANSFORMER_BASED_WRAP (FSDP) refuses a listed
        # class that no module has. post_init() gathers it from the submodels as for any model.
        self._no_split_modules = ["IBertLSTMLayer" if config.lstm_feed_forward else "BertLayer"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        # The base class covers Linear, Embedding, LayerNorm and LSTM (Xavier-uniform weights, zero biases).
        super()._init_weights(module)
        if isinstance(module, BertLMPredictionHead):
            init.zeros_(module.bias)


class IBertModel(IBertPreTrainedModel):
    """I-BERT encoder: BiLSTM-read embeddings, BERT's encoder and (optionally) BERT's pooler."""

    def __init__(self, config: InductiveBertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = IBertEmbeddings(config)
        self.encoder = IBertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPooling:
        r"""
        attention_mask (`torch.Tensor` of shape `(batch_size, sequence_length)`, *optional*):
            1 for real tokens, 0 for padding, which may sit anywhere in a row. Padding changes no real token's output:
            the LSTM reads each row's real tokens only and attention ignores the padding.
        position_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
            Only with `use_position_embeddings=True`; defaults to `0 .. sequence_length - 1`.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Specify exactly one of input_ids or inputs_embeds")
        input_shape = tuple((input_ids if input_ids is not None else inputs_embeds).shape[:2])
        if attention_mask is not None and tuple(attention_mask.shape) != input_shape:
            # The LSTM packs each row's real tokens, which only a (batch, seq) padding mask of the input's own shape
            # defines: a 4-D attention mask may not, and a broadcast one would drop or invent rows.
            raise ValueError(
                f"attention_mask must be a (batch, seq) padding mask of the input's shape {input_shape}, got shape "
                f"{tuple(attention_mask.shape)}"
            )
        embedding_output = self.embeddings(
            input_ids=input_ids,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            padding_mask=attention_mask,
        )
        extended_attention_mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=embedding_output, attention_mask=attention_mask
        )
        sequence_output = self.encoder(
            embedding_output, extended_attention_mask, padding_mask=attention_mask, **kwargs
        )  # (batch, seq, hidden)
        pooled_output = self.pooler(sequence_output) if self.pooler is not None else None
        return BaseModelOutputWithPooling(last_hidden_state=sequence_output, pooler_output=pooled_output)


class IBertForMaskedLM(IBertPreTrainedModel):
    r"""
    I-BERT with BERT's masked-language-modeling head (`cls.predictions`, tied to the word embeddings). This is
    `hf_recurrence.IBertForMaskedLM`, not transformers' Integer-BERT class of the same name.

    Example:

    ```python
    >>> import torch
    >>> from hf_recurrence import IBertForMaskedLM, InductiveBertConfig

    >>> config = InductiveBertConfig(
    ...     vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37
    ... )
    >>> model = IBertForMaskedLM(config).eval()
    >>> ids = torch.randint(1, 99, (2, 1000))  # twice BERT's default position table: there is no length limit
    >>> model(ids).logits.shape
    torch.Size([2, 1000, 99])

    ```"""

    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def __init__(self, config: InductiveBertConfig):
        super().__init__(config)
        self.bert = IBertModel(config, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(config)
        self.loss_type = "ForMaskedLM"
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.cls.predictions.decoder = new_embeddings
        self.cls.predictions.bias = new_embeddings.bias

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs,
    ) -> MaskedLMOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
            Token ids to predict at masked positions; -100 elsewhere (as `DataCollatorForLanguageModeling` makes).
            With `config.sparse_prediction`, the head runs at these positions only and `logits` is
            `(num_labelled, vocab_size)`.
        """
        outputs = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True, **kwargs
        )
        sequence_output = outputs.last_hidden_state  # (batch, seq, hidden)
        if self.config.sparse_prediction and labels is not None:
            # The vocabulary projection dominates a step for a large vocabulary; unlabelled positions add nothing to
            # the loss, so they skip it.
            labelled = labels != -100  # (batch, seq)
            sequence_output = sequence_output[labelled]  # (labelled, hidden)
            labels = labels[labelled]  # (labelled,)
        logits = self.cls(sequence_output)  # (batch, seq, vocab), or (labelled, vocab)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        return MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class IBertForSequenceClassification(IBertPreTrainedModel):
    """I-BERT with BERT's sequence classification/regression head: a linear layer on the pooled first token."""

    def __init__(self, config: InductiveBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = IBertModel(config)
        self.dropout = nn.Dropout(classifier_dropout(config))
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.loss_type = "ForSequenceClassification"
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs,
    ) -> SequenceClassifierOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
            Class indices, or float targets for regression (`num_labels == 1`) and multi-label classification.
        """
        outputs = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True, **kwargs
        )
        logits = self.classifier(self.dropout(outputs.pooler_output))  # (batch, num_labels)
        loss = None
        if labels is not None:
            loss = self.loss_function(labels=labels, pooled_logits=logits, config=self.config, **kwargs)
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class IBertForTokenClassification(IBertPreTrainedModel):
    """I-BERT with BERT's token classification head: a linear layer on every final hidden state."""

    def __init__(self, config: InductiveBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = IBertModel(config, add_pooling_layer=False)
        self.dropout = nn.Dropout(classifier_dropout(config))
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.loss_type = "ForTokenClassification"
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs,
    ) -> TokenClassifierOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
            Class index per token; -100 where no label applies.
        """
        outputs = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True, **kwargs
        )
        logits = self.classifier(self.dropout(outputs.last_hidden_state))  # (batch, seq, num_labels)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, self.config, **kwargs)
        return TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


__all__ = [
    "IBertForMaskedLM",
    "IBertForSequenceClassification",
    "IBertForTokenClassification",
    "IBertModel",
    "IBertPreTrainedModel",
]
