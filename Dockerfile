# Switchyard's container image: the release binary alone, on distroless, as a non-root user.
#
#   docker build -t switchyard:0.1.0 .
#
# The chart runs it as `switchyard serve ...` (ENTRYPOINT below, args from the chart).

# The builder's Rust is pinned at or above Cargo.toml's rust-version (tests/chart.rs checks).
ARG RUST_VERSION=1.89.0

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# Only what the build reads (.dockerignore keeps the rest out of the context).
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
# Embedded in the binary: `switchyard simulate` with no --scenario runs it.
COPY examples/scenario.yaml ./examples/scenario.yaml
# Cargo.lock as committed; no debug info in the shipped binary (the release profile keeps
# line tables for profiling on a workstation).
ENV CARGO_PROFILE_RELEASE_DEBUG=0
RUN cargo build --release --locked --bin switchyard \
    && install -m 0755 target/release/switchyard /switchyard

# glibc and libgcc only (rustls with ring: no OpenSSL), bookworm like the builder, uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /switchyard /switchyard
USER nonroot:nonroot
# HTTPS (webhooks, extender) and HTTP (probes, metrics): the chart's ports.https/ports.http.
EXPOSE 9443 8080
ENTRYPOINT ["/switchyard"]
