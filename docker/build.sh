#!/usr/bin/env bash
# Build ackgate's broker images on a machine that cannot pull from a registry.
#
#   docker/build.sh [--rebuild]
#
# 1. ackgate/debian:bookworm  a Debian bookworm minbase rootfs (debootstrap from the apt
#                             mirror this machine uses), `docker import`ed. Skipped when
#                             BASE_IMAGE names an image to start from instead.
# 2. ackgate/jre:17           + openjdk-17-jre-headless (apt inside the build reaches the
#                             Debian mirror; nothing else is fetched from inside).
# 3. ackgate/kafka:4.1.1, ackgate/sqs:elasticmq-1.6.11, ackgate/pubsub-emulator:0.8.20
#                             jars fetched on the host (Maven; the Cloud SDK's emulator
#                             jar) and COPYed in.
#
# An image that exists is kept (instant rerun) unless --rebuild is given. Prints the
# ACKGATE_*_IMAGE lines that point ackgate.testing at the images.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
export DOCKER_HOST="${DOCKER_HOST:-unix:///run/docker.sock}"
rebuild=false
[[ "${1:-}" == "--rebuild" ]] && rebuild=true

cache="${XDG_CACHE_HOME:-$HOME/.cache}/ackgate"
kafka_pom="$repo/ackgate/testing/kafka-pom.xml"
kafka_version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$kafka_pom")"
elasticmq_version="$(sed -n 's:.*<elasticmq.version>\(.*\)</elasticmq.version>.*:\1:p' "$here/sqs/pom.xml")"
emulator_lib=/usr/lib/google-cloud-sdk/platform/pubsub-emulator/lib
emulator_jar="$(ls "$emulator_lib"/cloud-pubsub-emulator-*-all.jar 2>/dev/null | head -n1 || true)"
emulator_version="$(basename "${emulator_jar:-x-0-all.jar}" | sed 's/cloud-pubsub-emulator-\(.*\)-all.jar/\1/')"

debian_image=ackgate/debian:bookworm
jre_image=ackgate/jre:17
kafka_image="ackgate/kafka:$kafka_version"
sqs_image="ackgate/sqs:elasticmq-$elasticmq_version"
pubsub_image="ackgate/pubsub-emulator:$emulator_version"

present() { ! $rebuild && docker image inspect "$1" >/dev/null 2>&1; }
say() { echo "docker/build.sh: $*" >&2; }

# Fetch Maven artifacts once into $2 (a cache directory, complete when $2/complete exists).
mvn_libs() {
    local pom="$1" home="$2"
    if [[ ! -e "$home/complete" ]]; then
        rm -rf "$home/libs.partial" && mkdir -p "$home/libs.partial"
        mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies \
            -DoutputDirectory="$home/libs.partial" >&2
        rm -rf "$home/libs" && mv "$home/libs.partial" "$home/libs" && touch "$home/complete"
    fi
    echo "$home/libs"
}

# Build $1 from docker/$2 with the files of context directory $3 (staged copy).
build() {
    local tag="$1" name="$2" stage
    shift 2
    stage="$(mktemp -d)"
    cp -r "$here/$name/." "$stage/"
    while (($#)); do cp -r "$1" "$stage/$2"; shift 2; done
    say "building $tag"
    docker build -q --build-arg "BASE=$jre_image" -t "$tag" "$stage" >/dev/null
    rm -rf "$stage"
}

started=$SECONDS
base="${BASE_IMAGE:-}"
if [[ -z "$base" ]]; then
    base=$debian_image
    if ! present "$base"; then
        mirror="$(sed -n 's/^URIs: *\(.*debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)"
        mirror="${mirror:-$(sed -n 's/^deb \(http[^ ]*debian\) bookworm .*/\1/p' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | head -n1)}"
        mirror="${mirror:-http://deb.debian.org/debian}"
        command -v debootstrap >/dev/null || { apt-get update -q && apt-get install -y -q debootstrap; } >&2
        rootfs="$(mktemp -d)"
        say "debootstrap bookworm from $mirror"
        debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >/dev/null
        tar -C "$rootfs" -c . | docker import - "$base" >/dev/null
        rm -rf "$rootfs"
    fi
fi
if ! present "$jre_image"; then
    say "building $jre_image from $base"
    docker build -q --build-arg "BASE=$base" -t "$jre_image" "$here/jre" >/dev/null
fi
if ! present "$kafka_image"; then
    build "$kafka_image" kafka "$(mvn_libs "$kafka_pom" "$cache/kafka-$kafka_version")" libs
fi
if ! present "$sqs_image"; then
    build "$sqs_image" sqs "$(mvn_libs "$here/sqs/pom.xml" "$cache/elasticmq-$elasticmq_version")" libs
fi
if [[ -z "$emulator_jar" ]]; then
    say "no Pub/Sub emulator under $emulator_lib (install google-cloud-cli-pubsub-emulator); skipped"
elif ! present "$pubsub_image"; then
    build "$pubsub_image" pubsub "$emulator_lib" lib
fi
say "images ready in $((SECONDS - started))s"
echo "export ACKGATE_KAFKA_IMAGE=$kafka_image"
echo "export ACKGATE_SQS_IMAGE=$sqs_image"
[[ -n "$emulator_jar" ]] && echo "export ACKGATE_PUBSUB_IMAGE=$pubsub_image"
exit 0
