//! `stripe-emulator`: a stateful emulator of the Stripe API subset the rail uses.
//!
//! ```text
//! stripe-emulator --listen 127.0.0.1:12111 --secret-key sk_test_… --publishable-key pk_test_… \
//!     [--webhook-url http://127.0.0.1:8080/stripe --webhook-secret whsec_…]
//! ```

use std::net::SocketAddr;
use std::sync::Arc;

use clap::Parser;
use stripe_emulator::{Emulator, EmulatorConfig};

#[derive(Parser)]
#[command(about = "A stateful Stripe API emulator (PaymentIntents, Refunds, test cards, webhooks)")]
struct Args {
    /// Address to listen on (port 0 picks one; the address is printed).
    #[arg(long, default_value = "127.0.0.1:12111")]
    listen: SocketAddr,
    /// The secret key clients must present.
    #[arg(
        long,
        env = "STRIPE_EMULATOR_SECRET_KEY",
        hide_env_values = true,
        default_value = "sk_test_emulator"
    )]
    secret_key: String,
    /// The publishable key (may only confirm with a client secret).
    #[arg(long, default_value = "pk_test_emulator")]
    publishable_key: String,
    /// Deliver webhooks here.
    #[arg(long)]
    webhook_url: Option<String>,
    /// The webhook endpoint's signing secret.
    #[arg(long, env = "STRIPE_EMULATOR_WEBHOOK_SECRET", hide_env_values = true)]
    webhook_secret: Option<String>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let cfg = EmulatorConfig {
        secret_key: args.secret_key,
        publishable_key: args.publishable_key,
        webhook: args.webhook_url.zip(args.webhook_secret),
        clock: Arc::new(rail_core::SystemClock),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let running = Emulator::spawn(cfg, args.listen).await?;
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(out, "stripe-emulator listening on {}", running.url)?;
        out.flush()?;
        drop(out);
        tokio::signal::ctrl_c().await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
}
