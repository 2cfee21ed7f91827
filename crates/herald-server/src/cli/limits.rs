//! `herald limits list|set|remove`: limits on a running server, of runs
//! at once and of starts per period.

use reqwest::Method;
use serde_json::Value;

use super::{print, table, text, unexpected, Api, Failure, Remote};

/// List, set and remove limits.
#[derive(clap::Subcommand, Debug)]
pub enum LimitsCommand {
    /// List the limits (a tenant token sees the defaults and its own).
    List(ListArgs),
    /// Set a limit of HANDLER's events, counted per --per: at most
    /// --running runs at once, at most --rate starts per period, or both.
    /// A raised limit lets its waiting events run now.
    Set(SetArgs),
    /// Remove a limit; the events it held run as slots allow.
    Remove(NameArgs),
}

/// `herald limits list`.
#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// Only this handler's.
    #[arg(long)]
    pub handler: Option<String>,
    /// The server, the token, and `--json`.
    #[command(flatten)]
    pub remote: Remote,
}

/// What a limit counts and for whom.
#[derive(clap::Args, Debug)]
pub struct NameArgs {
    /// The handler whose runs it counts.
    pub handler: String,
    /// What counts together: every run of the handler (`handler`), each
    /// tenant's (`tenant`), or each concurrency key's (`key`).
    #[arg(long, value_parser = ["handler", "tenant", "key"], default_value = "handler")]
    pub per: String,
    /// One tenant's own limit (per tenant or per key); left out, the
    /// default of every tenant or key (operator token).
    #[arg(long)]
    pub tenant: Option<String>,
    /// One key's own limit (per key, with --tenant).
    #[arg(long, requires = "tenant")]
    pub key: Option<String>,
    /// The server, the token, and `--json`.
    #[command(flatten)]
    pub remote: Remote,
}

/// `herald limits set`.
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("what").required(true).multiple(true).args(["running", "rate"])))]
pub struct SetArgs {
    /// Most runs at once.
    #[arg(long, value_name = "N")]
    pub running: Option<u32>,
    /// Most starts per period: "10/1s", "600/1m".
    #[arg(long, value_name = "STARTS/PERIOD")]
    pub rate: Option<String>,
    /// Starts allowed at once after a quiet spell (with --rate; default 1).
    #[arg(long, value_name = "N", requires = "rate")]
    pub burst: Option<u32>,
    /// The limit's name.
    #[command(flatten)]
    pub name: NameArgs,
}

/// Runs a `limits` subcommand.
pub async fn run(command: LimitsCommand) -> Result<(), Failure> {
    match command {
        LimitsCommand::List(args) => list(args).await,
        LimitsCommand::Set(args) => set(args).await,
        LimitsCommand::Remove(args) => remove(args).await,
    }
}

/// The limit's name as the API's fields.
fn fields(n: &NameArgs) -> Vec<(&'static str, String)> {
    let mut out = vec![("handler", n.handler.clone()), ("per", n.per.clone())];
    if let Some(t) = &n.tenant {
        out.push(("tenant", t.clone()));
    }
    if let Some(k) = &n.key {
        out.push(("key", k.clone()));
    }
    out
}

/// "send_email per key acme/account-7" and the like.
fn describe(n: &NameArgs) -> String {
    let whose = match (&n.tenant, &n.key) {
        (Some(t), Some(k)) => format!(" {t}/{k}"),
        (Some(t), None) => format!(" {t}"),
        _ if n.per == "handler" => String::new(),
        _ => " (default)".to_string(),
    };
    format!("{} per {}{whose}", n.handler, n.per)
}

async fn set(args: SetArgs) -> Result<(), Failure> {
    let api = Api::new(&args.name.remote)?;
    let mut body: serde_json::Map<String, Value> = fields(&args.name)
        .into_iter()
        .map(|(k, v)| (k.to_string(), Value::String(v)))
        .collect();
    if let Some(n) = args.running {
        body.insert("running".into(), Value::from(n));
    }
    if let Some(rate) = &args.rate {
        let (starts, period) = rate.split_once('/').ok_or_else(|| {
            Failure::new(
                super::exit::USAGE,
                format!("--rate {rate:?}: write STARTS/PERIOD, as 10/1s or 600/1m"),
            )
        })?;
        let starts: u32 = starts.trim().parse().map_err(|_| {
            Failure::new(
                super::exit::USAGE,
                format!("--rate {rate:?}: {starts:?} is not a number"),
            )
        })?;
        let mut r = serde_json::Map::new();
        r.insert("starts".into(), Value::from(starts));
        r.insert("period".into(), Value::from(period.trim()));
        if let Some(b) = args.burst {
            r.insert("burst".into(), Value::from(b));
        }
        body.insert("rate".into(), Value::Object(r));
    }
    let body = Value::Object(body).to_string();
    let reply = api
        .call(Method::PUT, &["v1", "limits"], &[], Some(body))
        .await?;
    if args.name.remote.json {
        print(&reply.text);
        return Ok(());
    }
    let changed = match reply.value["changed"] {
        Value::Bool(b) => b,
        _ => return Err(unexpected("changed", &reply)),
    };
    let what = describe(&args.name);
    let mut set = Vec::new();
    if let Some(n) = args.running {
        set.push(format!("at most {n} at once"));
    }
    if let Some(r) = &args.rate {
        set.push(format!("at most {r} starts"));
    }
    let set = set.join(", ");
    print(&if changed {
        format!("{what}: {set}")
    } else {
        format!("{what}: already {set}")
    });
    Ok(())
}

async fn remove(args: NameArgs) -> Result<(), Failure> {
    let api = Api::new(&args.remote)?;
    let query = fields(&args);
    let reply = api
        .call(Method::DELETE, &["v1", "limits"], &query, None)
        .await?;
    if args.remote.json {
        print(&reply.text);
        return Ok(());
    }
    let what = describe(&args);
    print(&match reply.value["removed"] {
        Value::Bool(true) => format!("{what}: removed"),
        Value::Bool(false) => format!("{what}: there was none"),
        _ => return Err(unexpected("removed", &reply)),
    });
    Ok(())
}

async fn list(args: ListArgs) -> Result<(), Failure> {
    let api = Api::new(&args.remote)?;
    let query: Vec<(&str, String)> = args
        .handler
        .map(|h| vec![("handler", h)])
        .unwrap_or_default();
    let reply = api
        .call(Method::GET, &["v1", "limits"], &query, None)
        .await?;
    if args.remote.json {
        print(&reply.text);
        return Ok(());
    }
    let limits = reply.value["limits"]
        .as_array()
        .ok_or_else(|| unexpected("limits", &reply))?;
    let star = |v: &Value| {
        if v.is_null() {
            "*".to_string()
        } else {
            text(v)
        }
    };
    let rows: Vec<Vec<String>> = limits
        .iter()
        .map(|l| {
            vec![
                text(&l["handler"]),
                text(&l["per"]),
                if l["per"] == "handler" {
                    "-".into()
                } else {
                    star(&l["tenant"])
                },
                if l["per"] == "key" {
                    star(&l["key"])
                } else {
                    "-".into()
                },
                text(&l["running"]),
                if l["rate"].is_null() {
                    "-".to_string()
                } else {
                    let burst = match l["rate"]["burst"].as_u64() {
                        Some(b) => format!(" burst {b}"),
                        None => String::new(),
                    };
                    format!(
                        "{}/{}{burst}",
                        l["rate"]["starts"],
                        text(&l["rate"]["period"])
                    )
                },
                text(&l["source"]),
            ]
        })
        .collect();
    if rows.is_empty() {
        print("no limits");
        return Ok(());
    }
    print(&table(
        &[
            "HANDLER", "PER", "TENANT", "KEY", "RUNNING", "RATE", "SOURCE",
        ],
        &rows,
    ));
    Ok(())
}
