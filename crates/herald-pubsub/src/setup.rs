//! Connecting, and the topic and subscription: created when missing,
//! checked when present, and the streaming pull opened on them.

use std::time::{Duration, Instant};

use gcloud_gax::conn::{ConnectionOptions, Environment};
use gcloud_gax::grpc::{Code, Status};
use gcloud_pubsub::client::{Client, ClientConfig};
use gcloud_pubsub::subscriber::SubscriberConfig;
use gcloud_pubsub::subscription::{MessageStream, SubscribeConfig};
use herald::escape::escaped;
use herald::queue::{QueueError, QueueResult};

use crate::settings::{self};
use crate::{backend, Inner, PubsubConfig, CONNECT_WAIT};

/// A client for the emulator or the service, tried for [`CONNECT_WAIT`].
pub(crate) async fn client(config: &PubsubConfig) -> QueueResult<Client> {
    let emulator = config
        .emulator
        .clone()
        .or_else(|| std::env::var("PUBSUB_EMULATOR_HOST").ok())
        .filter(|h| !h.is_empty());
    let deadline = Instant::now() + CONNECT_WAIT;
    let mut waiting = false;
    loop {
        let options = ConnectionOptions {
            connect_timeout: Some(Duration::from_secs(5)),
            // A server that went away is noticed within seconds, not when
            // the kernel gives up on the connection.
            http2_keep_alive_interval: Some(Duration::from_secs(10)),
            keep_alive_timeout: Some(Duration::from_secs(5)),
            keep_alive_while_idle: Some(true),
            timeout: None,
        };
        let mut cc = ClientConfig {
            project_id: Some(config.project.clone()),
            connection_option: options,
            ..ClientConfig::default()
        };
        let where_ = match &emulator {
            Some(host) => {
                cc.environment = Environment::Emulator(host.clone());
                format!("the Pub/Sub emulator at {host}")
            }
            None => {
                cc = match &config.credentials {
                    Some(path) => {
                        let file = gcloud_pubsub::client::google_cloud_auth::credentials::CredentialsFile::new_from_file(
                            path.display().to_string(),
                        )
                        .await
                        .map_err(|e| {
                            QueueError::Config(format!(
                                "cannot read the credentials file {}: {e}",
                                path.display()
                            ))
                        })?;
                        cc.with_credentials(file).await
                    }
                    None => cc.with_auth().await,
                }
                .map_err(|e| {
                    QueueError::Config(format!(
                        "no Google Cloud credentials: {e} (set GOOGLE_APPLICATION_CREDENTIALS or pubsub_credentials to a service-account key file, run on Google Cloud, or set PUBSUB_EMULATOR_HOST for the emulator)"
                    ))
                })?;
                // The configured project, not the credentials'.
                cc.project_id = Some(config.project.clone());
                "Pub/Sub".to_string()
            }
        };
        match Client::new(cc).await {
            Ok(c) => return Ok(c),
            Err(e) => {
                if Instant::now() >= deadline {
                    return Err(backend(&format!("connect to {where_}"), e));
                }
                if !waiting {
                    tracing::warn!(
                        "cannot connect to {where_} yet: {e}; trying again for up to {CONNECT_WAIT:?}",
                        e = escaped(&e)
                    );
                    waiting = true;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

impl Inner {
    /// Creates the topic and the subscription when missing; checks the
    /// subscription when present. Returns the warnings.
    pub(crate) async fn ensure(&self) -> QueueResult<Vec<String>> {
        let config = &self.config;
        let topic = self.client.topic(&config.topic);
        let exists = topic
            .exists(None)
            .await
            .map_err(|e| backend(&format!("look up topic {}", config.topic_name()), e))?;
        if !exists {
            match topic.create(None, None).await {
                Ok(()) => tracing::info!(topic = %config.topic_name(), "created the topic"),
                // Another worker was first.
                Err(e) if e.code() == Code::AlreadyExists => {}
                Err(e) => return Err(backend(&format!("create topic {}", config.topic_name()), e)),
            }
        }
        let wanted = settings::wanted_subscription(config);
        let found = match self.subscription.config(None).await {
            Ok(found) => Some(found),
            Err(e) if e.code() == Code::NotFound => None,
            Err(e) => {
                return Err(backend(
                    &format!("look up subscription {}", config.subscription_name()),
                    e,
                ))
            }
        };
        let (topic_name, got) = match found {
            Some(found) => found,
            None => {
                match self
                    .subscription
                    .create(&config.topic_name(), wanted.clone(), None)
                    .await
                {
                    Ok(()) => {
                        tracing::info!(subscription = %config.subscription_name(), ack_deadline = ?config.ack_deadline(), "created the subscription");
                    }
                    Err(e) if e.code() == Code::AlreadyExists => {}
                    Err(e) => {
                        return Err(backend(
                            &format!("create subscription {}", config.subscription_name()),
                            e,
                        ))
                    }
                }
                self.subscription.config(None).await.map_err(|e| {
                    backend(
                        &format!("look up subscription {}", config.subscription_name()),
                        e,
                    )
                })?
            }
        };
        settings::check_subscription(config, &topic_name, &got)
    }

    pub(crate) async fn subscribe(&self) -> Result<MessageStream, Status> {
        let secs = self.config.ack_deadline().as_secs() as i32;
        let sc = SubscriberConfig {
            stream_ack_deadline_seconds: secs,
            max_outstanding_messages: self.config.max_outstanding as i64,
            // Bytes are never the limit: a notification is under 100 bytes.
            max_outstanding_bytes: 0,
            ..SubscriberConfig::default()
        };
        self.subscription
            .subscribe(Some(
                SubscribeConfig::default()
                    .with_subscriber_config(sc)
                    .with_channel_capacity(self.config.max_outstanding),
            ))
            .await
    }
}
