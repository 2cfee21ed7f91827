//! `herald migrate`: create or upgrade herald's schema in a store.

/// Options of `herald migrate`.
#[derive(clap::Args)]
pub struct MigrateArgs {
    /// The store: `postgres://…`, or `sqlite://PATH` (or a plain path).
    #[arg(long, env = "HERALD_STORE", default_value = "sqlite://herald.db")]
    store: String,
    /// The PostgreSQL schema herald keeps its tables in.
    #[arg(long, env = "HERALD_PG_SCHEMA", default_value = "herald")]
    schema: String,
}

/// Errors of `herald migrate`.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The store refused or failed.
    #[error(transparent)]
    Store(#[from] herald::StoreError),
}

/// Creates or upgrades herald's tables in the store `args` names.
pub async fn run(args: MigrateArgs) -> Result<(), MigrateError> {
    if args.store.starts_with("postgres://") || args.store.starts_with("postgresql://") {
        let (from, to) = herald_postgres::migrate(&args.store, &args.schema).await?;
        if from == to {
            println!("schema {:?} is up to date (version {to})", args.schema);
        } else {
            println!(
                "schema {:?} migrated from version {from} to {to}",
                args.schema
            );
        }
    } else {
        let path = args.store.strip_prefix("sqlite://").unwrap_or(&args.store);
        // Opening applies the embedded migrations.
        herald_sqlite::SqliteStore::open(path)?;
        println!(
            "{path} is up to date (schema version {})",
            herald_sqlite::SCHEMA_VERSION
        );
    }
    Ok(())
}
