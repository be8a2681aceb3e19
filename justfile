# The same commands as README.md and .ci/run; plain cargo works too.

example:
    cargo run --release --example trip_booking -- --sagas 200 --fail-rate 0.2 --seed 1

test:
    scripts/test

lint:
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets --locked -- -D warnings
    cargo clippy -p agentsaga --lib --locked --no-default-features --features sqlite -- -D warnings
    cargo clippy -p agentsaga --lib --locked --no-default-features --features postgres -- -D warnings
    RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked

# Needs cargo-deny (.ci/run installs the pinned version). Advisories are not part of CI
# (no network for the database there); with network: cargo deny check advisories
deny:
    cargo deny check licenses bans sources

bench:
    cargo run --release -p agentsaga-bench -- outbox
    cargo run --release -p agentsaga-bench -- relay
    cargo run --release -p agentsaga-bench -- saga
    cargo run --release -p agentsaga-bench -- scale
    cargo run --release -p agentsaga-bench -- agents

ci:
    bash .ci/run
