#!/usr/bin/env bash
# Builds the Go writer offline from Debian's pinned packages (no module proxy is needed or asked):
#
#   apt-get install -y golang-go=2:1.19~1 golang-github-nats-io-go-nats-dev=1.22.1-1
#   clients/go/build.sh [OUTPUT]        # default: clients/go/runledger-go
#
# go.mod pins nats.go v1.22.1 and its dependencies; vendor/modules.txt is the lock. The vendored
# sources are links to the Debian packages' trees in /usr/share/gocode/src, made here after the
# installed versions are checked against the pins, and the build runs with -mod=vendor, GOPROXY=off.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/runledger-go}
src=/usr/share/gocode/src
pins=("golang-go 2:1.19~1" "golang-github-nats-io-go-nats-dev 1.22.1-1" "golang-github-nats-io-nkeys-dev 0.3.0-2"
      "golang-github-nats-io-nuid-dev 1.0.1-1" "golang-golang-x-crypto-dev 1:0.4.0-1")
command -v go >/dev/null || { echo "build.sh: go is not installed: apt-get install -y golang-go=2:1.19~1 golang-github-nats-io-go-nats-dev=1.22.1-1" >&2; exit 2; }
for pin in "${pins[@]}"; do
    package=${pin% *} want=${pin#* }
    have=$(dpkg-query -W -f='${Version}' "$package" 2>/dev/null || true)
    if [ "$have" != "$want" ]; then
        echo "build.sh: $package is ${have:-not installed}, the pin is $want: apt-get install -y $package=$want" >&2
        exit 2
    fi
done
grep -q 'Version *= "1.22.1"' "$src/github.com/nats-io/nats.go/nats.go" \
    || { echo "build.sh: $src/github.com/nats-io/nats.go is not nats.go 1.22.1" >&2; exit 2; }
mkdir -p "$here/vendor/github.com/nats-io" "$here/vendor/golang.org/x/crypto"
for module in github.com/nats-io/nats.go github.com/nats-io/nkeys github.com/nats-io/nuid golang.org/x/crypto/ed25519; do
    ln -sfn "$src/$module" "$here/vendor/$module"
done
cd "$here"
GOFLAGS=-mod=vendor GOPROXY=off GOTOOLCHAIN=local GO111MODULE=on go build -trimpath -o "$out" .
