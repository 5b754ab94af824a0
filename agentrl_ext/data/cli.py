"""``agentrl-data``: install, fetch and list the benchmark data (never part of this project).

    agentrl-data list                       # what is installed, verified against pinned checksums
    agentrl-data install --from DIR         # from a local copy (CI: ../shared/data)
    agentrl-data fetch [--only GROUP,...]   # from the public sources, at pinned commits
    agentrl-data path                       # print the data directory

``--data-dir DIR`` (before or after the command) or ``$AGENTRL_DATA_DIR`` chooses the data
directory; the default is ``~/.local/share/agentrl_ext/data`` (``$XDG_DATA_HOME``).
Exit codes: 0 fine, 1 a file is corrupt / could not be installed or fetched, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import Counter, defaultdict

from agentrl_ext import cli
from agentrl_ext.data.fetch import GITHUB_RAW, fetch
from agentrl_ext.data.store import file_statuses, install_from
from agentrl_ext.env.data_files import DATA_DIR_ENV, DataError, data_dir, default_data_dir
from agentrl_ext.env.data_manifest import GROUPS


def _list(args: argparse.Namespace) -> int:
    root = data_dir(args.data_dir)
    statuses = file_statuses(root)
    if args.json:
        print(
            json.dumps(
                {
                    "data_dir": str(root),
                    "files": [
                        {"path": s.entry.path, "group": s.entry.group, "state": s.state, "problem": s.problem}
                        for s in statuses
                    ],
                },
                indent=1,
            )
        )
    else:
        print(f"data directory: {root}")
        by_group: dict[str, Counter[str]] = defaultdict(Counter)
        for status in statuses:
            by_group[status.entry.group][status.state] += 1
        print(f"{'group':<18}{'ok':>6}{'missing':>9}{'corrupt':>9}")
        for group in GROUPS:
            counts = by_group[group]
            print(f"{group:<18}{counts['ok']:>6}{counts['missing']:>9}{counts['corrupt']:>9}")
        for status in statuses:
            if status.state == "corrupt":
                print(f"CORRUPT {status.entry.path}: {status.problem}")
            elif args.verbose and status.state == "missing":
                print(f"missing {status.entry.path}")
        if not any(s.state == "ok" for s in statuses):
            print("nothing installed: run `agentrl-data install --from DIR` or `agentrl-data fetch`")
    return 1 if any(s.state == "corrupt" for s in statuses) else 0


def _install(args: argparse.Namespace) -> int:
    root = data_dir(args.data_dir)
    try:
        installed = install_from(args.source, root)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"installed {len(installed)} files from {args.source} into {root} (all checksums verified)")
    return 0


def _fetch(args: argparse.Namespace) -> int:
    groups = [g for g in args.only.split(",") if g] if args.only else None
    unknown = sorted(set(groups or ()) - set(GROUPS))
    if unknown:
        print(f"error: unknown group(s) {unknown}; groups are: {', '.join(GROUPS)}", file=sys.stderr)
        return 2
    root = data_dir(args.data_dir)
    results = fetch(groups, root, raw_base=args.raw_base, workers=args.workers)
    counts = Counter(r.outcome for r in results)
    for result in results:
        if result.outcome == "failed":
            print(f"FAILED {result.path}: {result.detail}", file=sys.stderr)
    copy_only = sorted({r.detail for r in results if r.outcome == "copy-only"})
    for reason in copy_only:
        paths = [r.path for r in results if r.outcome == "copy-only" and r.detail == reason]
        print(f"not downloadable ({reason}): {', '.join(paths)}; use `agentrl-data install --from DIR`")
    print(
        f"{root}: {counts['fetched']} fetched, {counts['present']} already present, "
        f"{counts['copy-only']} copy-only, {counts['failed']} failed"
    )
    return 1 if counts["failed"] else 0


def _path(args: argparse.Namespace) -> int:
    print(data_dir(args.data_dir))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``agentrl-data`` argument parser."""
    parser = cli.parser(
        "agentrl-data",
        "Install, fetch and list the AgentBench / ALFWorld / WebShop data.",
        epilog=f"data directory: --data-dir, else ${DATA_DIR_ENV}, else {default_data_dir()}",
    )
    parser.add_argument(
        "--data-dir", default=None, help=f"data directory (none: ${DATA_DIR_ENV}, else the XDG default)"
    )
    # the same flag after the command; SUPPRESS keeps a value given before it
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command", required=True)

    listing = commands.add_parser(
        "list", parents=[common], formatter_class=cli.HelpFormatter, help="show what is installed (verified)"
    )
    listing.add_argument("--json", action="store_true", help="one JSON object with every file's state")
    listing.add_argument("-v", "--verbose", action="store_true", help="also name the missing files")
    listing.set_defaults(run=_list)

    install = commands.add_parser(
        "install", parents=[common], formatter_class=cli.HelpFormatter, help="install from a local copy"
    )
    install.add_argument("--from", dest="source", required=True, help="folder of the copy (with SHA256SUMS)")
    install.set_defaults(run=_install)

    fetching = commands.add_parser(
        "fetch", parents=[common], formatter_class=cli.HelpFormatter, help="download from the public sources"
    )
    fetching.add_argument("--only", default=None, help=f"comma-separated groups of: {', '.join(GROUPS)}")
    fetching.add_argument(
        "--raw-base",
        default=GITHUB_RAW,
        help="base URL of raw repository files (a mirror or a file:// folder)",
    )
    fetching.add_argument("--workers", type=int, default=8, help="parallel downloads")
    fetching.set_defaults(run=_fetch)

    path = commands.add_parser(
        "path", parents=[common], formatter_class=cli.HelpFormatter, help="print the data directory"
    )
    path.set_defaults(run=_path)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Console entry point of ``agentrl-data``."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return int(args.run(args))


if __name__ == "__main__":
    raise SystemExit(main())
