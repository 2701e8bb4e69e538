//! Where queues run on AWS: one EC2 instance per queue node, one EBS volume per queue that outlives its instances.
//!
//! The control plane wraps this crate in its provider; nothing here knows about queues beyond their id, so the
//! AWS SDK (slow to build) stays out of every other crate's build.
//!
//! - `settings` — what the control plane configures: the cluster name, the regions and where instances go in each.
//! - `tags` — the tags that make everything findable again: nothing is remembered here, AWS is the record.
//! - `instances` — launch, list, find and terminate the queues' instances.
//! - `status` — whether EC2 is bringing an instance back by itself (a reboot, a recovery).
//! - `volumes` — find or create a queue's data volume, attach it, delete it.
//! - `error` — one error type: our own refusals, AWS's refusals (with their code) and unanswered calls.

mod error;
mod instances;
mod pace;
mod settings;
mod status;
mod tags;
mod volumes;

use std::collections::BTreeMap;
use std::sync::Arc;

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
use aws_smithy_runtime_api::client::orchestrator::Metadata;

use aws_config::environment::EnvironmentVariableRegionProvider;
use aws_config::meta::region::RegionProviderChain;
use aws_config::profile::ProfileFileRegionProvider;
use aws_config::{BehaviorVersion, Region};
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};

pub use aws_sdk_ec2;
pub use error::Ec2Error;
pub use instances::{Instance, Launch};
pub use settings::{RegionSettings, Settings};
pub use status::InstanceHealth;
pub use tags::{Slot, CLUSTER_TAG, DATA_VOLUME, PURPOSE_TAG, QUEUE_TAG, SLOT_TAG};
pub use volumes::Volume;

/// The EC2 API of every configured region, scoped to one cluster by its tag.
#[derive(Clone, Debug)]
pub struct Ec2 {
    /// Read by every call: the cluster tag, the regions' subnets and images, the volume shape.
    settings: Settings,
    /// One client per configured region: an EC2 client talks to one region only.
    clients: BTreeMap<String, aws_sdk_ec2::Client>,
    /// The requests sent so far, by operation ([`Ec2::requests`]).
    sent: Arc<Sent>,
    /// Each region's pacing of mutating calls.
    pacing: Arc<BTreeMap<String, pace::Pacing>>,
}

/// Requests sent to EC2, by operation: each attempt counts (a retry is one more request EC2
/// meters against its rate limits).
#[derive(Debug, Default)]
struct Sent(std::sync::Mutex<BTreeMap<String, u64>>);

/// Counts every request a client sends, by operation.
#[derive(Debug)]
struct CountRequests(Arc<Sent>);

impl aws_sdk_ec2::config::Intercept for CountRequests {
    fn name(&self) -> &'static str {
        "CountRequests"
    }

    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &aws_sdk_ec2::config::RuntimeComponents,
        cfg: &mut aws_sdk_ec2::config::ConfigBag,
    ) -> Result<(), BoxError> {
        if let Some(operation) = cfg.load::<Metadata>() {
            let mut sent = self.0 .0.lock().expect("never poisoned");
            *sent.entry(operation.name().to_string()).or_default() += 1;
        }
        Ok(())
    }
}

impl Ec2 {
    /// Builds one client per configured region from the standard credential chain (environment, profile, web
    /// identity, container or instance role), so the same binary runs on a laptop and on an instance with a role.
    pub async fn new(settings: Settings) -> Ec2 {
        let shared = shared_config(&settings).await;
        let sent = Arc::new(Sent::default());
        let clients = settings
            .regions
            .keys()
            .map(|region| (region.clone(), region_client(&shared, region, &sent)))
            .collect();
        let pacing = settings
            .regions
            .keys()
            .map(|region| (region.clone(), pace::Pacing::default()))
            .collect();
        Ec2 {
            settings,
            clients,
            sent,
            pacing: Arc::new(pacing),
        }
    }

    /// Waits for a mutating call's turn in `region` (`pace.rs`): a launch's, or another
    /// change's.
    async fn paced(&self, region: &str, launch: bool) -> Result<(), Ec2Error> {
        let pacing = self
            .pacing
            .get(region)
            .ok_or_else(|| Ec2Error::NoSuchRegion(region.to_owned()))?;
        match launch {
            true => pacing.launches.take().await,
            false => pacing.changes.take().await,
        }
        Ok(())
    }

    /// How many requests each EC2 operation has been sent so far, by every client of this
    /// (`bench ec2-pass` counts a reconcile pass's with it).
    pub fn requests(&self) -> BTreeMap<String, u64> {
        self.sent.0.lock().expect("never poisoned").clone()
    }

    /// The settings this was built with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    fn region_settings(&self, region: &str) -> Result<&RegionSettings, Ec2Error> {
        self.settings
            .regions
            .get(region)
            .ok_or_else(|| Ec2Error::NoSuchRegion(region.to_owned()))
    }

    /// The raw SDK client of a region, for what this crate does not wrap (tests build networks with it).
    pub fn client(&self, region: &str) -> Result<&aws_sdk_ec2::Client, Ec2Error> {
        self.clients
            .get(region)
            .ok_or_else(|| Ec2Error::NoSuchRegion(region.to_owned()))
    }
}

/// The configuration every region's client starts from.
///
/// The HTTP client is built here rather than taken from the SDK's defaults, which would bring aws-lc-rs next to
/// the workspace's ring-only rustls. The shared region only serves credential providers that call STS (web
/// identity); every EC2 client sets its own. It is never asked of the instance metadata service, which would
/// stall start-up by a timeout anywhere but on EC2.
async fn shared_config(settings: &Settings) -> aws_config::SdkConfig {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .build_https();
    let fallback = settings.regions.keys().next().cloned().map(Region::new);
    let region = RegionProviderChain::first_try(EnvironmentVariableRegionProvider::new())
        .or_else(ProfileFileRegionProvider::new())
        .or_else(fallback);
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .http_client(http)
        .region(region);
    if let Some(endpoint) = &settings.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    loader.load().await
}

fn region_client(
    shared: &aws_config::SdkConfig,
    region: &str,
    sent: &Arc<Sent>,
) -> aws_sdk_ec2::Client {
    // Adaptive: a throttled call (`RequestLimitExceeded`) is retried after a backoff with
    // jitter, and once throttled the client also limits its own rate until EC2 lets up. Five
    // attempts: a fleet's pass is repeated anyway, a caller waiting on one call is not kept long.
    let retry = aws_sdk_ec2::config::retry::RetryConfig::adaptive().with_max_attempts(5);
    let config = aws_sdk_ec2::config::Builder::from(shared)
        .region(Region::new(region.to_owned()))
        .retry_config(retry)
        .interceptor(CountRequests(sent.clone()))
        .build();
    aws_sdk_ec2::Client::from_conf(config)
}
