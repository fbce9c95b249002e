from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from . import configuration_inductive_bert, modeling_inductive_bert
from .configuration_inductive_bert import InductiveBertConfig
from .modeling_inductive_bert import (
    IBertForMaskedLM,
    IBertForSequenceClassification,
    IBertForTokenClassification,
    IBertModel,
    IBertPreTrainedModel,
)


AutoConfig.register(InductiveBertConfig.model_type, InductiveBertConfig, exist_ok=True)
AutoModel.register(InductiveBertConfig, IBertModel, exist_ok=True)
AutoModelForMaskedLM.register(InductiveBertConfig, IBertForMaskedLM, exist_ok=True)
AutoModelForSequenceClassification.register(InductiveBertConfig, IBertForSequenceClassification, exist_ok=True)
AutoModelForTokenClassification.register(InductiveBertConfig, IBertForTokenClassification, exist_ok=True)

InductiveBertConfig.register_for_auto_class()
IBertModel.register_for_auto_class("AutoModel")
IBertForMaskedLM.register_for_auto_class("AutoModelForMaskedLM")
IBertForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
IBertForTokenClassification.register_for_auto_class("AutoModelForTokenClassification")

__all__ = [*configuration_inductive_bert.__all__, *modeling_inductive_bert.__all__]
