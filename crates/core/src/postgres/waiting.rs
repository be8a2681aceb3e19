//! PostgreSQL's count of the rows waiting per destination (the operator's
//! [`waiting_by_destination`](crate::admin::Admin::waiting_by_destination)).

use sqlx::Row;

use super::Postgres;
use crate::Result;
use crate::store::admin_types::DestinationRows;

impl Postgres {
    pub(crate) async fn waiting_by_destination(&self) -> Result<Vec<DestinationRows>> {
        let rows = sqlx::query(
            "SELECT destination,
                    count(*) FILTER (WHERE state = 'pending') AS pending,
                    count(*) FILTER (WHERE state = 'in_flight') AS in_flight
             FROM outbox WHERE state IN ('pending', 'in_flight')
             GROUP BY destination ORDER BY destination",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(DestinationRows {
                    destination: r.try_get("destination")?,
                    pending: r.try_get::<i64, _>("pending")?.max(0) as u64,
                    in_flight: r.try_get::<i64, _>("in_flight")?.max(0) as u64,
                })
            })
            .collect()
    }
}
