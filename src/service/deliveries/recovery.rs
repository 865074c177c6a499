//! After a restart: the deliveries a crash left unsettled.

use super::handle::Deliveries;
use crate::host::metrics::DeliveryOutcome;
use crate::store::outbox::{OutboxRecord, Unsettled};
use perch_core::alert::AlertKind;
use perch_core::delivery::Unreceipted;
use perch_core::log::Settled;
use perch_core::starts::OutboxRecovered;

impl Deliveries {
    /// Resends inside the platform's window (through the rooms' workers, so startup does not
    /// wait for them), reports unknowns, drops the old.
    pub(in crate::service) async fn settle_unsettled(
        &self,
        unsettled: Vec<Unsettled>,
    ) -> Result<OutboxRecovered, String> {
        let (mut resent, mut unknown, mut expired) = (0, 0, 0);
        for delivery in unsettled {
            let Some(channel) = self.channels.get(&delivery.channel) else {
                continue;
            };
            let window = channel.connector.limits().resend_window;
            match self.outbox.decide(&delivery, window) {
                Unreceipted::Resend => {
                    resent += 1;
                    self.queue(
                        channel,
                        vec![(delivery.seq, delivery.delivery)],
                        delivery.lane,
                    );
                }
                Unreceipted::Unknown => {
                    unknown += 1;
                    let reason = "perch stopped between recording this delivery and its receipt; it is not resent, so it is never posted twice".to_owned();
                    tracing::warn!(
                        channel = %delivery.channel,
                        delivery = %delivery.delivery.id,
                        "delivery {} on {}: unknown",
                        delivery.delivery.id,
                        delivery.channel
                    );
                    self.common
                        .metrics
                        .settled(&delivery.channel, DeliveryOutcome::Unknown);
                    self.common.alerts.alert(
                        AlertKind::DeliveryUnknown,
                        format!(
                            "delivery {} to {} room {} has an unknown fate: perch stopped \
                             between recording it and its receipt. It may or may not have been \
                             posted, and is not sent again; `perch status` lists it.",
                            delivery.delivery.id, delivery.channel, delivery.delivery.room
                        ),
                    );
                    let record = OutboxRecord::Unknown {
                        intent: delivery.seq,
                        reason,
                    };
                    let settled = record.settled();
                    self.settle_recovered(delivery, record, settled).await?;
                }
                Unreceipted::Expired => {
                    expired += 1;
                    self.common
                        .metrics
                        .settled(&delivery.channel, DeliveryOutcome::Dropped);
                    let reason = "older than the outbox's time to live".to_owned();
                    let record = OutboxRecord::Dropped {
                        intent: delivery.seq,
                        reason: reason.clone(),
                    };
                    let settled = Some(Settled::Dropped { reason });
                    self.settle_recovered(delivery, record, settled).await?;
                }
            }
        }
        Ok(OutboxRecovered {
            resent,
            unknown,
            expired,
        })
    }

    /// Records `record`, which settles `delivery`, then tells the delivery's lane `settled`.
    async fn settle_recovered(
        &self,
        delivery: Unsettled,
        record: OutboxRecord,
        settled: Option<Settled>,
    ) -> Result<(), String> {
        self.outbox
            .settle(delivery.seq, record)
            .await
            .map_err(|error| error.to_string())?;
        self.tell_lane(
            &delivery.channel,
            &delivery.delivery,
            delivery.lane,
            settled,
        );
        Ok(())
    }
}
