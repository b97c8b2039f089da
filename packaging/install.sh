#!/usr/bin/env bash
# Install jobd on a server: a virtual environment of its own under PREFIX (so it works where
# the system Python is externally managed, PEP 668: Debian 12, Ubuntu 24.04), the `jobd`
# command linked into BINDIR, and with --units the systemd units and the sysusers file.
# docs/operations/install.md says more (upgrade, uninstall).
#
#   sudo packaging/install.sh                       # from this checkout
#   sudo packaging/install.sh dist/jobd-*.whl       # from a wheel (python -m build)
#   sudo packaging/install.sh --units               # and systemd/jobd.service, jobd@.service
#   sudo PREFIX=/srv/jobd BINDIR=/usr/bin packaging/install.sh --units
#
# Run again with a newer wheel or checkout to upgrade in place (pip install --upgrade).
# Variables: PREFIX (the venv), BINDIR (the link), MANDIR (jobd(1), jobd.yaml(5)),
# COMPLETIONDIR (bash completion), UNITDIR and SYSUSERSDIR (--units), PYTHON (3.11 or later,
# makes the venv), PIP_ARGS (more pip options, e.g. --no-index).
set -euo pipefail

PREFIX="${PREFIX:-/opt/jobd}"
BINDIR="${BINDIR:-/usr/local/bin}"
MANDIR="${MANDIR:-/usr/local/share/man}"
COMPLETIONDIR="${COMPLETIONDIR:-/usr/local/share/bash-completion/completions}"
UNITDIR="${UNITDIR:-/etc/systemd/system}"
SYSUSERSDIR="${SYSUSERSDIR:-/etc/sysusers.d}"
PYTHON="${PYTHON:-python3}"
HERE="$(cd "$(dirname "$0")/.." && pwd)"  # the checkout (or unpacked sdist) this script is in

units=0
source="$HERE"
for arg in "$@"; do
  case $arg in
    --units) units=1 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "install.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
    *) source="$arg" ;;
  esac
done

# The units run BINDIR/jobd, written into their Exec lines by sed: a path systemd would split
# (white space, quotes), expand ($, %, \) or sed would take for its own (&, |) is refused, as is
# a relative one (systemd runs absolute paths only; the link would point nowhere). PREFIX too.
for var in PREFIX BINDIR; do
  value="${!var}"
  if [[ $value != /* || $value == *[[:space:][:cntrl:]\"\'\\\$%\&\|]* ]]; then
    echo "install.sh: $var must be an absolute path without white space, quotes," \
      "\\, \$, %, & or | (got '$value')" >&2
    exit 2
  fi
done

umask 022  # the venv and the link are read by the service's user, jobd
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "install.sh: jobd needs Python 3.11 or later ($PYTHON is older)" >&2; exit 1; }
[[ -x $PREFIX/bin/python ]] || "$PYTHON" -m venv "$PREFIX"
# shellcheck disable=SC2086  # PIP_ARGS: several options, split on purpose
"$PREFIX/bin/python" -m pip install --quiet --upgrade ${PIP_ARGS:-} "$source"
mkdir -p "$BINDIR"
ln -sfn "$PREFIX/bin/jobd" "$BINDIR/jobd"
echo "installed $("$BINDIR/jobd" --version) in $PREFIX; $BINDIR/jobd -> $PREFIX/bin/jobd"
# The man pages and the completion, made by the installed jobd from its own parser and schema.
pages="$(mktemp -d)"
"$PREFIX/bin/python" -m jobd.manpages "$pages" >/dev/null
install -D -m 644 "$pages/jobd.1" "$MANDIR/man1/jobd.1"
install -D -m 644 "$pages/jobd.yaml.5" "$MANDIR/man5/jobd.yaml.5"
rm -rf "$pages"
mkdir -p "$COMPLETIONDIR"
"$BINDIR/jobd" completion bash > "$COMPLETIONDIR/jobd"
echo "installed $MANDIR/man1/jobd.1, $MANDIR/man5/jobd.yaml.5, $COMPLETIONDIR/jobd"

if (( units )); then
  mkdir -p "$UNITDIR" "$SYSUSERSDIR"
  # The units run /usr/local/bin/jobd: another BINDIR is written into the copies.
  for unit in jobd.service jobd@.service; do
    sed "s|/usr/local/bin/jobd|$BINDIR/jobd|g" "$HERE/systemd/$unit" > "$UNITDIR/$unit"
    chmod 644 "$UNITDIR/$unit"
  done
  install -m 644 "$HERE/systemd/jobd.sysusers.conf" "$SYSUSERSDIR/jobd.conf"
  echo "installed $UNITDIR/jobd.service, $UNITDIR/jobd@.service, $SYSUSERSDIR/jobd.conf"
  if [[ $UNITDIR == /etc/systemd/system ]] && [[ -d /run/systemd/system ]]; then
    systemd-sysusers "$SYSUSERSDIR/jobd.conf"
    systemctl daemon-reload
    echo "next: write /etc/jobd/jobd.yaml, then: systemctl enable --now jobd"
  fi
fi
