//! A throwaway `nats-server -js` per test: core's test support
//! ([`NatsServer`](agentsaga_core::testing::NatsServer)), restartable on its port and store.

pub(crate) use agentsaga_core::testing::NatsServer as Server;
