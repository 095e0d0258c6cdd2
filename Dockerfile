# Larder's container image: the release binary, built exactly as CI builds it, on a distroless
# base (glibc, CA certificates, no shell), running as an unprivileged user.
#
#   docker build -t larder:0.1.0 .
#
# e2e/tests/test_image.py checks the runtime half of this file on every test run: it copies the
# server binary CI built (target/release/larder), with the libraries it links, into a `FROM scratch` image with this file's
# USER, EXPOSE, ENTRYPOINT and CMD, and serves S3 requests from it. The base images below cannot
# be pulled on the CI machines (no registry access), so that stage stands in for them.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# The server only (the demo, with its embedded S3 origin, is the package larder-demo): the
# package e2e/test-all.sh builds the image's binary under test from.
RUN cargo build --release --locked -p larder && install -D target/release/larder /out/larder

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/larder /usr/local/bin/larder
USER 65532:65532
EXPOSE 9000 9001
ENTRYPOINT ["/usr/local/bin/larder"]
CMD ["serve", "--config", "/etc/larder/larder.toml"]
