"""``python -m analysis report RECORDS_DIR [--format csv|parquet]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis.report import write_report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("report", help="write summary.json, report.md and plots for a records folder")
    r.add_argument("records_dir")
    r.add_argument("--format", choices=["csv", "parquet"])
    args = p.parse_args(argv)
    try:
        out = write_report(Path(args.records_dir), export=args.format)
    except (FileNotFoundError, ValueError) as e:
        print(f"analysis report: error: {e}", file=sys.stderr)
        return 2
    print(out.markdown)
    print(out.answer)  # the answer last: each configuration's effect in percent and its decisions
    return 0


if __name__ == "__main__":
    sys.exit(main())
