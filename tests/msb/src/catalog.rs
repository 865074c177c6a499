//! The runtime's share of the catalog (`<home>/db/msb.db`): one `run` row per boot, and at exit
//! the run `Terminated` and the sandbox `Stopped`, written the way the real runtime's exit
//! observer writes them (`microsandbox-runtime` `runner/vm.rs`).

use microsandbox_db::connection::DbWriteConnection;
use microsandbox_db::entity::{run, sandbox};
use sea_orm::sea_query::Expr;
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter};
use std::path::Path;
use std::time::Duration;

/// Why the runtime ended, as the catalog records it.
pub use run::TerminationReason;

/// A write connection to the catalog and the run row this boot owns.
#[derive(Debug)]
pub struct Catalog {
    db: DbWriteConnection,
    sandbox_id: i32,
    run_id: i32,
}

impl Catalog {
    /// Opens the catalog at `db_path` and inserts this boot's `Running` run row.
    pub async fn open_run(
        db_path: &Path,
        connect_timeout_secs: u64,
        sandbox_id: i32,
        pid: u32,
    ) -> Result<Catalog, String> {
        let db = DbWriteConnection::open(
            db_path,
            Duration::from_secs(connect_timeout_secs.max(1)),
            Duration::from_secs(microsandbox_db::pool::DEFAULT_BUSY_TIMEOUT_SECS),
        )
        .await
        .map_err(|error| format!("database connect: {error}"))?;
        let record = run::ActiveModel {
            sandbox_id: Set(sandbox_id),
            pid: Set(i32::try_from(pid).ok()),
            status: Set(run::RunStatus::Running),
            started_at: Set(Some(chrono::Utc::now().naive_utc())),
            ..Default::default()
        };
        let run_id = run::Entity::insert(record)
            .exec(&db)
            .await
            .map_err(|error| format!("insert run: {error}"))?
            .last_insert_id;
        Ok(Catalog {
            db,
            sandbox_id,
            run_id,
        })
    }

    /// Marks the run `Terminated` with `InternalError` after a failed boot, leaving the sandbox
    /// row to the crate, as the real runtime's `mark_run_failed` does.
    pub async fn mark_failed(&self) -> Result<(), String> {
        run::Entity::update_many()
            .col_expr(run::Column::Status, Expr::value(run::RunStatus::Terminated))
            .col_expr(
                run::Column::TerminationReason,
                Expr::value(TerminationReason::InternalError),
            )
            .col_expr(
                run::Column::TerminatedAt,
                Expr::value(chrono::Utc::now().naive_utc()),
            )
            .filter(run::Column::Id.eq(self.run_id))
            .exec(&self.db)
            .await
            .map(drop)
            .map_err(|error| format!("mark run failed: {error}"))
    }

    /// Marks the run `Terminated` with `reason` and `exit_code`, then the sandbox `Stopped` with
    /// its runtime-only columns cleared. Call with the runtime's sockets already removed and the
    /// lifecycle lock still held: the crate reads the lock's release as "these rows are final".
    pub async fn finish(&self, reason: TerminationReason, exit_code: i32) -> Result<(), String> {
        let now = chrono::Utc::now().naive_utc();
        run::Entity::update_many()
            .col_expr(run::Column::Status, Expr::value(run::RunStatus::Terminated))
            .col_expr(run::Column::TerminationReason, Expr::value(reason))
            .col_expr(run::Column::ExitCode, Expr::value(exit_code))
            .col_expr(run::Column::TerminatedAt, Expr::value(now))
            .filter(run::Column::Id.eq(self.run_id))
            .exec(&self.db)
            .await
            .map_err(|error| format!("mark run terminated: {error}"))?;
        let update = microsandbox_db::catalog::clear_runtime_fields(
            &self.db,
            sandbox::Entity::update_many(),
        )
        .await
        .map_err(|error| format!("read the sandbox schema: {error}"))?;
        update
            .col_expr(
                sandbox::Column::Status,
                Expr::value(sandbox::SandboxStatus::Stopped),
            )
            .col_expr(sandbox::Column::UpdatedAt, Expr::value(now))
            .filter(sandbox::Column::Id.eq(self.sandbox_id))
            .exec(&self.db)
            .await
            .map_err(|error| format!("mark sandbox stopped: {error}"))?;
        Ok(())
    }
}
