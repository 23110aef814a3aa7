//! The human views the command prints: what a mandate allows, what a closed tab captured.

use stipendex::envelope::{Allow, Mandate};

/// What a mandate allows, in a few lines.
pub fn describe(m: &Mandate) -> String {
    let mut s = format!(
        "mandate {} of {} ({}) for wallet {}\n  valid from {} until {} (UTC)\n",
        m.id,
        m.principal.id,
        m.principal.key,
        m.wallet,
        rail_core::clock::rfc3339(m.nbf),
        rail_core::clock::rfc3339(m.exp)
    );
    for l in &m.limits {
        let a = &l.asset;
        let mut parts = Vec::new();
        if let Some(x) = l.per_call {
            parts.push(format!("{x} {a} per call"));
        }
        if let Some(p) = &l.per_period {
            parts.push(format!("{} {a} per {} s", p.amount, p.seconds));
        }
        if let Some(x) = l.total {
            parts.push(format!("{x} {a} in total"));
        }
        if let Some(x) = l.per_receiver {
            parts.push(format!("{x} {a} per receiver"));
        }
        if let Some(x) = l.confirm_above {
            parts.push(format!("a human confirms above {x} {a}"));
        }
        if let Some(x) = l.tab_cap {
            parts.push(format!(
                "tabs of up to {x} {a} ({} open at once)",
                l.open_tabs.unwrap_or(1)
            ));
        }
        if parts.is_empty() {
            parts.push(format!("{a} without limits"));
        }
        s.push_str(&format!("  limits: {}\n", parts.join(", ")));
    }
    if m.allow.is_empty() {
        s.push_str("  allows: nobody (every receiver is denied)\n");
    }
    for a in &m.allow {
        let line = match a {
            Allow::Receiver { id, key, origins } if origins.is_empty() => {
                format!("receiver {id} ({key}), not over HTTP (no origin pinned)")
            }
            Allow::Receiver { id, key, origins } => {
                format!("receiver {id} ({key}) at {}", origins.join(", "))
            }
            Allow::X402Http { origin, pay_to } => {
                format!("x402 over HTTP from {origin} to {pay_to}")
            }
            Allow::X402Mcp { server, pay_to } => format!("x402 over MCP from {server} to {pay_to}"),
            Allow::Contextvm { server } => format!("ContextVM server {server} (CEP-8)"),
        };
        s.push_str(&format!("  allows: {line}\n"));
    }
    if let Some(r) = &m.rails {
        s.push_str(&format!("  rails: {}\n", r.join(", ")));
    }
    s
}

/// `tab <id>: N calls, captured X of cap Y`.
pub fn tab_line(t: &stipendex::envelope::TabReceipt) -> String {
    let fixed = |a| {
        stipendex::Money::new(t.asset.clone(), a).map_or_else(|_| a.to_string(), |m| m.to_fixed())
    };
    format!(
        "tab {}: {} call{}, captured {} of cap {} {}",
        t.tab,
        t.calls,
        if t.calls == 1 { "" } else { "s" },
        fixed(t.captured),
        fixed(t.cap),
        t.asset
    )
}
