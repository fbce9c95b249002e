"""Upload a folder written by `save_pretrained` to the Hugging Face Hub in one commit, adding a model card (README.md
with metadata, recurrence settings, citation and a trust_remote_code usage snippet) unless the folder has one.

The Hub is the one `HF_ENDPOINT` names; the token comes from --token, `HF_TOKEN` or `hf auth login`.
"""

import argparse

from ..hub import DEFAULT_COMMIT_MESSAGE, push_folder


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", help="Folder written by save_pretrained (config.json, weights, model code).")
    parser.add_argument("repo_id", help="Target repo, namespace/name; created if it does not exist.")
    parser.add_argument("--revision", help="Branch to commit to, created from main if missing (default: main).")
    parser.add_argument("--private", action="store_true", help="Create the repo as private.")
    parser.add_argument("--token", help="Hub token (default: HF_TOKEN or the stored login).")
    parser.add_argument("--commit_message", default=DEFAULT_COMMIT_MESSAGE, help="Commit message.")
    parser.add_argument("--base_model", help="Hub checkpoint this one was converted from, for the model card.")


def run(args: argparse.Namespace) -> int:
    commit = push_folder(
        args.folder,
        args.repo_id,
        base_model=args.base_model,
        revision=args.revision,
        private=args.private or None,
        token=args.token,
        commit_message=args.commit_message,
    )
    print(f"Pushed {args.folder} to {commit.repo_url.repo_id} at commit {commit.oid}: {commit.commit_url}")
    return 0
