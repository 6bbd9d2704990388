#!/usr/bin/env bash
# Builds the Go example client offline, from Debian's packages (GOPATH mode, no module proxy):
#   apt-get install golang-go golang-google-grpc-dev golang-google-protobuf-dev \
#                   golang-github-golang-protobuf-1-5-dev protoc-gen-go protoc-gen-go-grpc protobuf-compiler
# (golang-github-golang-protobuf-1-5-dev, not -1-3-dev: grpc-go's codec goes through
# github.com/golang/protobuf, and only the 1.5 API decodes protoc-gen-go 1.28 messages.)
# Generated code goes to clients/go/gen/, the binary to clients/go/bin/inference-client.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
GEN="$HERE/gen"

if [[ -f /usr/share/gocode/src/github.com/golang/protobuf/proto/table_unmarshal.go ]]; then
  echo "github.com/golang/protobuf is the 1.3 API: apt-get install golang-github-golang-protobuf-1-5-dev" >&2
  exit 1
fi

rm -rf "$GEN"
mkdir -p "$GEN/src" "$HERE/bin"
# paths=import places the code under its go_package import path inside $GEN/src (a GOPATH root).
protoc -I"$ROOT/protos" \
  --go_out="$GEN/src" --go_opt=paths=import \
  --go-grpc_out="$GEN/src" --go-grpc_opt=paths=import \
  "$ROOT/protos/inference.proto"

export GO111MODULE=off
export GOPATH="$GEN:/usr/share/gocode"
export GOFLAGS=
export GOCACHE="${GOCACHE:-${HOME:-/tmp}/.cache/go-build}"
cd "$HERE/cmd/inference-client"
go build -o "$HERE/bin/inference-client" .
echo "built $HERE/bin/inference-client"
