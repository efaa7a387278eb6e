# fleetwatch: one image, a subcommand per role (`hub`, `agent`, `lifecycle`, ...).
#
#   docker build --build-arg REVISION=$(git rev-parse HEAD) -t fleetwatch:dev .
#   docker run --rm fleetwatch:dev --help
#
# Without Docker, scripts/image.sh builds the same layout with buildah from the release
# binary and smoke-tests it.
#
# The build stage compiles the same release binary CI builds (`cargo build --release
# --locked -p fleetwatch --no-default-features`: without the sandbox); the runtime stage is
# distroless: no shell, no package manager, glibc and CA certificates only, running as the unprivileged UID/GID 65532 ("nonroot").
# The binary writes nothing outside the paths it is given (`--data-dir`, certificates
# mounted read-only), so it runs with a read-only root filesystem; the Helm charts set
# readOnlyRootFilesystem, drop every capability and mount a volume for the hub's data.

# Both base images are pinned by digest (the tag says which release it was): a rebuild gets
# the bytes that were reviewed. To move to a newer one, look the digest up and replace it
# here, e.g. `docker buildx imagetools inspect rust:1.95-bookworm` or `crane digest
# gcr.io/distroless/cc-debian12:nonroot`.
# NOT VERIFIED against the registries: the machines fleetwatch is built and tested on reach
# neither Docker Hub nor gcr.io (2026-11-27: no DNS for registry-1.docker.io or gcr.io).
# The two digests are the ones other public projects pin for these tags (one Docker build
# log resolves docker.io/library/rust:1.95-bookworm to the first). Before a release, on a
# machine with access, check that each tag's manifest-list digest is the one below, e.g.
#   skopeo inspect --format '{{.Digest}}' docker://docker.io/library/rust:1.95-bookworm
#   skopeo inspect --format '{{.Digest}}' docker://gcr.io/distroless/cc-debian12:nonroot
# (or `crane digest IMAGE:TAG`); a tag moves on, so a different answer may mean a newer
# build rather than a wrong pin: then `skopeo inspect docker://IMAGE@sha256:<pinned>` must
# still resolve, and its config (`--config`) must say User 65532 for the distroless one.
# USER 65532:65532 below does not depend on the base image's config either way.
#
# BuildKit (the default builder since Docker 23): the cargo registry is a cache mount, so a
# rebuild downloads no crate twice; the dependencies are compiled in a layer of their own.

# The toolchain CI builds and tests with (edition 2024; some dependencies need a recent one).
FROM rust:1.95-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS build
WORKDIR /src
# cargo-auditable embeds the dependency list into the binary (for scanners), as
# scripts/image.sh builds it: `cargo install --locked` of a pinned version.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    cargo install --locked cargo-auditable@0.7.7
# Dependencies first, so a change in the sources does not rebuild them: a skeleton of the
# workspace (every member of Cargo.toml's [workspace] members, each with empty targets;
# tests/e2e/release.rs checks that the lists below match Cargo.toml) is built once and cached
# as a layer.
COPY Cargo.toml Cargo.lock ./
COPY protocol/Cargo.toml protocol/
COPY api/Cargo.toml api/
COPY certs/Cargo.toml certs/
COPY client/Cargo.toml client/
COPY agent/Cargo.toml agent/
COPY bus/Cargo.toml bus/
COPY hub/Cargo.toml hub/
COPY lifecycle/Cargo.toml lifecycle/
COPY relay/Cargo.toml relay/
COPY telemetry/Cargo.toml telemetry/
COPY sim/Cargo.toml sim/
COPY dst/Cargo.toml dst/
COPY bench/Cargo.toml bench/
COPY cli/Cargo.toml cli/
COPY test-support/Cargo.toml test-support/
# The image's binary has no sandbox (`--no-default-features`: no in-memory Kubernetes API
# server), as scripts/image.sh builds it.
ARG CARGO_FEATURES=--no-default-features
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    set -eu; \
    for c in protocol api certs client agent bus hub lifecycle relay telemetry sim dst bench test-support; do mkdir -p $c/src && echo > $c/src/lib.rs; done; \
    mkdir -p cli/src tests/e2e sim/examples && echo 'fn main() {}' > cli/src/main.rs && echo > tests/e2e/main.rs; \
    echo 'fn main() {}' > sim/examples/bench.rs; \
    cargo auditable build --release --locked -p fleetwatch $CARGO_FEATURES
COPY . .
# The commit `fleetwatch version` prints (the build context has no .git):
#   docker build --build-arg FLEETWATCH_GIT_COMMIT=$(git rev-parse --short=12 HEAD) .
# Without it the binary says "unknown".
ARG FLEETWATCH_GIT_COMMIT=
# Touch the sources so cargo rebuilds them over the skeleton's empty ones.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    find protocol api certs client agent bus hub lifecycle relay telemetry sim dst bench test-support cli -name '*.rs' -exec touch {} + \
    && cargo auditable build --release --locked -p fleetwatch $CARGO_FEATURES \
    && install -D -m 0755 target/release/fleetwatch /out/fleetwatch

# gcr.io/distroless/cc-debian12:nonroot
FROM gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="fleetwatch" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://example.invalid/fleetwatch" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/fleetwatch /usr/local/bin/fleetwatch
USER 65532:65532
# wss (agents, subscribers), admin (/healthz, /readyz, /metrics), lifecycle and agent health.
EXPOSE 7443 9090 9091
ENTRYPOINT ["/usr/local/bin/fleetwatch"]
CMD ["--help"]
