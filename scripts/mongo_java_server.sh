#!/usr/bin/env bash
# Resolve mongo-java-server (a third-party MongoDB wire-protocol fake, in-memory backend) and its
# dependencies from Maven Central once, with Maven, into a local cache. The MongoDB tests start it
# from these jars (tests/mongo/); no MongoDB server can be installed on these machines.
# Idempotent and offline after the first run. Prints the jar directory.
# Usage: scripts/mongo_java_server.sh [VERSION]
set -euo pipefail
VERSION="${1:-${MONGO_JAVA_SERVER_VERSION:-1.47.0}}"
CACHE="${CHANGELAKE_JAR_CACHE:-$HOME/.cache/changelake/jars}/mongo-java-server/$VERSION"

if [ ! -f "$CACHE/.complete" ]; then
  mkdir -p "$CACHE"
  work="$(mktemp -d -t changelake-mjs-XXXXXX)"
  trap 'rm -rf "$work"' EXIT
  cat > "$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>changelake</groupId><artifactId>mongo-java-server-deps</artifactId><version>0</version>
  <dependencies>
    <dependency><groupId>de.bwaldvogel</groupId><artifactId>mongo-java-server</artifactId><version>$VERSION</version></dependency>
    <dependency><groupId>de.bwaldvogel</groupId><artifactId>mongo-java-server-memory-backend</artifactId><version>$VERSION</version></dependency>
  </dependencies>
</project>
POM
  echo "mongo_java_server: resolving de.bwaldvogel:mongo-java-server:$VERSION with dependencies (first run only)" >&2
  if ! mvn -q -B -f "$work/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
      -DoutputDirectory="$CACHE" >"$CACHE/mvn.log" 2>&1; then
    echo "mongo_java_server: could not resolve from Maven Central; see $CACHE/mvn.log" >&2; exit 1
  fi
  touch "$CACHE/.complete"
fi
echo "$CACHE"
