#!/usr/bin/env bash
# Checks the report page's script without a browser: node --check (page.js parses) always, and
# eslint with the rules in eslint.config.js when an eslint 9 or later is installed (on PATH, or
# named by $ESLINT). Nothing is downloaded, so the check runs offline. ctest runs it as
# cli.report_script; exit 77 (skipped) without node.
set -uo pipefail
dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if ! command -v node >/dev/null; then
  echo "SKIP: node is not installed (scripts/install-deps.sh installs nodejs)"
  exit 77
fi
if ! node --check "$dir/page.js"; then
  echo "FAIL: node --check $dir/page.js"
  exit 1
fi
echo "ok: node --check page.js"

eslint=${ESLINT:-$(command -v eslint || true)}
if [[ -z "$eslint" ]]; then
  echo "note: no eslint installed, so page.js is parsed but not linted (npm install -g eslint@9)"
  exit 0
fi
version=$("$eslint" --version 2>/dev/null)
major=${version#v}
major=${major%%.*}
if [[ ! "$major" =~ ^[0-9]+$ ]] || ((major < 9)); then
  echo "note: $eslint is '${version}'; eslint.config.js needs eslint 9 or later, so no lint"
  exit 0
fi
cd "$dir" || exit 1
if ! "$eslint" --config eslint.config.js --max-warnings 0 page.js; then
  echo "FAIL: eslint $version on $dir/page.js"
  exit 1
fi
echo "ok: eslint $version page.js"
