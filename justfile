# The same commands as README.md and .ci/run; plain cargo works too.

example:
    cargo run --release --example trip_booking -- --sagas 200 --fail-rate 0.2 --seed 1

test:
    scripts/test

# fmt, clippy, each backend alone, doc, and cargo-deny when installed (what .ci/run
# runs before the tests).
lint:
    scripts/verify

bench:
    cargo run --release -p agentsaga-bench -- outbox
    cargo run --release -p agentsaga-bench -- relay
    cargo run --release -p agentsaga-bench -- saga
    cargo run --release -p agentsaga-bench -- scale
    cargo run --release -p agentsaga-bench -- agents

ci:
    bash .ci/run
