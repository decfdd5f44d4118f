#!/usr/bin/env bash
# Builds the Go writer offline with any Go toolchain from 1.19 on: its dependencies are vendored.
#
#   clients/go/build.sh [OUTPUT]        # default: clients/go/runledger-go
#
# go.mod pins nats.go v1.22.1 and its dependencies; vendor/ holds their sources (the packages the
# writer imports, with their licences) and vendor/modules.txt is the lock. The build runs with
# -mod=vendor, GOPROXY=off and GOTOOLCHAIN=local: nothing is fetched, no module cache is read.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/runledger-go}
command -v go >/dev/null || { echo "build.sh: go is not installed (any toolchain from 1.19 on: apt-get install -y golang-go)" >&2; exit 2; }
version=$(go env GOVERSION)  # go1.19.8, go1.22rc1...
minor=$(echo "$version" | sed -E 's/^go1\.([0-9]+).*/\1/')
if ! [[ $minor =~ ^[0-9]+$ ]] || [ "$minor" -lt 19 ]; then
    echo "build.sh: $version is older than go1.19, the oldest toolchain go.mod accepts" >&2
    exit 2
fi
cd "$here"
GOFLAGS=-mod=vendor GOPROXY=off GOTOOLCHAIN=local GO111MODULE=on go build -trimpath -o "$out" .
