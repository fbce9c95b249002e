"""Upload a folder written by `save_pretrained` to the Hugging Face Hub in one commit, adding a model card (README.md
with metadata, recurrence settings, citation and a trust_remote_code usage snippet) unless the folder has one.

Exactly the files a checkpoint needs are uploaded: the code files its `auto_map` names (and the files they import),
config and generation config, weights and their index, tokenizer files, the model card. Anything else (scripts, logs,
a saved recurrent state) only with --include; pickles and symlinks out of the folder never. The lists of what is
uploaded and what is left out are printed before the upload.

The Hub is the one `HF_ENDPOINT` names; the token comes from --token, `HF_TOKEN` or `hf auth login`.
"""

import argparse

from ..hub import DEFAULT_COMMIT_MESSAGE, files_to_push, push_folder


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", help="Folder written by save_pretrained (config.json, weights, model code).")
    parser.add_argument("repo_id", help="Target repo, namespace/name; created if it does not exist.")
    parser.add_argument("--revision", help="Branch to commit to, created from main if missing (default: main).")
    parser.add_argument("--private", action="store_true", help="Create the repo as private.")
    parser.add_argument("--token", help="Hub token (default: HF_TOKEN or the stored login).")
    parser.add_argument("--commit_message", default=DEFAULT_COMMIT_MESSAGE, help="Commit message.")
    parser.add_argument("--base_model", help="Hub checkpoint this one was converted from, for the model card.")
    parser.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="PATTERN",
        help="Also upload the files whose path in the folder matches this glob pattern (repeatable); a saved "
        "recurrent state only by its exact name. Pickles are never uploaded.",
    )


def run(args: argparse.Namespace) -> int:
    print(files_to_push(args.folder, args.include).describe_uploaded())
    commit = push_folder(
        args.folder,
        args.repo_id,
        base_model=args.base_model,
        revision=args.revision,
        private=args.private or None,
        token=args.token,
        commit_message=args.commit_message,
        include=args.include,
    )
    print(f"Pushed {args.folder} to {commit.repo_url.repo_id} at commit {commit.oid}: {commit.commit_url}")
    return 0
