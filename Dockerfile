# fleetwatch: one image, a subcommand per role (`hub`, `agent`, `lifecycle`, ...).
#
#   docker build -t fleetwatch:dev .
#   docker run --rm fleetwatch:dev --help
#
# The build stage compiles the same release binary CI builds (`cargo build --release
# --locked -p fleetwatch`); the runtime stage is distroless: no shell, no package manager,
# glibc and CA certificates only, running as the unprivileged UID/GID 65532 ("nonroot").
# The binary writes nothing outside the paths it is given (`--data-dir`, certificates
# mounted read-only), so it runs with a read-only root filesystem; the Helm charts set
# readOnlyRootFilesystem, drop every capability and mount a volume for the hub's data.

# The toolchain CI builds and tests with (edition 2024; some dependencies need a recent one).
ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# Dependencies first, so a change in the sources does not rebuild them: a skeleton of the
# workspace with empty targets is built once and cached as a layer.
COPY Cargo.toml Cargo.lock ./
COPY protocol/Cargo.toml protocol/
COPY api/Cargo.toml api/
COPY client/Cargo.toml client/
COPY certs/Cargo.toml certs/
COPY agent/Cargo.toml agent/
COPY hub/Cargo.toml hub/
COPY lifecycle/Cargo.toml lifecycle/
COPY sim/Cargo.toml sim/
COPY cli/Cargo.toml cli/
RUN set -eu; \
    for c in protocol api client certs agent hub lifecycle sim; do mkdir -p $c/src && echo > $c/src/lib.rs; done; \
    mkdir -p cli/src tests/e2e sim/examples && echo 'fn main() {}' > cli/src/main.rs && echo > tests/e2e/main.rs; \
    echo 'fn main() {}' > sim/examples/bench.rs; \
    # Only a cache: should it fail, the real build below still compiles everything.
    cargo build --release --locked -p fleetwatch || true
COPY . .
# The commit `fleetwatch version` prints (the build context has no .git):
#   docker build --build-arg FLEETWATCH_GIT_COMMIT=$(git rev-parse --short=12 HEAD) .
# Without it the binary says "unknown".
ARG FLEETWATCH_GIT_COMMIT=
# Touch the sources so cargo rebuilds them over the skeleton's empty ones.
RUN find protocol api client certs agent hub lifecycle sim cli -name '*.rs' -exec touch {} + \
    && cargo build --release --locked -p fleetwatch \
    && install -D -m 0755 target/release/fleetwatch /out/fleetwatch

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/fleetwatch /usr/local/bin/fleetwatch
USER 65532:65532
# wss (agents, subscribers), admin (/healthz, /readyz, /metrics), lifecycle and agent health.
EXPOSE 7443 9090 9091
ENTRYPOINT ["/usr/local/bin/fleetwatch"]
CMD ["--help"]
