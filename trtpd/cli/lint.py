"""`trtpd lint`: check a prefill/decode deployment before it starts, not at the first request."""

from __future__ import annotations

from pathlib import Path

from trtpd.cli import args as a
from trtpd.errors import ConfigError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "lint", help="check P/D compatibility: engine pair, repository, MPI world, trtllm-serve configs, ports",
        description="Lint what trtpd build produced (engines/<model>), or any parts given by flag. "
                    "Exit status 1 when an error is found.")
    p.add_argument("model_dir", nargs="?", type=Path, help="engines/<model> as trtpd build wrote it")
    p.add_argument("--prefill", type=Path, help="prefill engine folder or its manifest.json")
    p.add_argument("--decode", type=Path, help="decode engine folder or its manifest.json")
    p.add_argument("--repo", type=Path, help="rendered Triton model repository")
    p.add_argument("--launch", type=Path, help="MPI launch script (launch_triton.sh)")
    p.add_argument("--serve-dir", type=Path,
                   help="folder with prefill.yaml, decode.yaml, disagg.yaml (and launch.sh): trtllm-serve/ or "
                        "serve-pytorch/, told apart by launch.sh's --backend; replaces both folders of MODEL_DIR")
    p.add_argument("--max-prompt-tokens", type=a.positive_int, help="longest prompt (default: prefill max_input_len)")
    p.add_argument("--max-output-tokens", type=a.positive_int, help="longest output (default: from the decode engine)")
    p.add_argument("--no-port-check", action="store_true", help="skip checking that ports are free on this host")
    p.add_argument("--list-rules", action="store_true", help="print the rules and exit")
    p.set_defaults(func=run)


def run(args) -> int:
    from trtpd.lint import RULES, DeploymentPaths, discover, errors, lint_deployment, summary

    if args.list_rules:
        a.refuse_given(args, ("model_dir", "prefill", "decode", "repo", "launch", "serve_dir", "max_prompt_tokens",
                              "max_output_tokens", "no_port_check"), "--list-rules lints nothing; drop one or the other")
        for rule, what in RULES.items():
            print(f"{rule:20} {what}")
        return 0
    paths = discover(args.model_dir) if args.model_dir else DeploymentPaths()
    given = {"prefill_manifest": args.prefill, "decode_manifest": args.decode, "repo": args.repo,
             "launch_script": args.launch, "serve_dir": args.serve_dir}
    paths = DeploymentPaths(**{k: given[k] or getattr(paths, k) for k in given},
                            serve_pytorch_dir=None if args.serve_dir else paths.serve_pytorch_dir)
    if not any(vars(paths).values()):
        raise ConfigError("nothing to lint: pass engines/<model>, or --prefill and --decode, --repo, --serve-dir")
    findings = lint_deployment(paths, max_prompt_tokens=args.max_prompt_tokens,
                               max_output_tokens=args.max_output_tokens, check_ports_free=not args.no_port_check)
    for f in findings:
        print(f.format())
    print(summary(findings))
    return 1 if errors(findings) else 0
