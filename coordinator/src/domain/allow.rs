//! Which branch targets the coordinator may call (`--allow-target`): without a list, a caller
//! could name any address and turn the coordinator into a door to every internal service.
//!
//! A rule is `SCHEME://HOST[:PORT][/PATH]`: scheme `http` or `https`; host a DNS name (`*.`
//! for any subdomain), an IP address, or an IP network written as an address and a prefix
//! length (`10.0.0.0/8`, `[fd00::]/8`); no port = any port; a path = that path and below. A
//! target is allowed when one rule matches its scheme, host, port and path.
//!
//! A name is checked twice: where it enters (the text), and when a call is made, against the
//! addresses it resolves to then (DNS rebinding): each must be inside an address rule that
//! matches the rest of the target, or, when only a name rule matched, be a public address -
//! so reaching an internal address by name needs that network allowed too.
//!
//! Pure: parsing and matching only; the resolving is the engine's.

use std::fmt;
use std::net::IpAddr;

/// One `--allow-target` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    scheme: String,
    host: Host,
    port: Option<u16>,
    path: String,
    text: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    /// Exact name, or `*.suffix` (one or more labels before `suffix`).
    Name {
        name: String,
        wildcard: bool,
    },
    Net {
        addr: IpAddr,
        prefix: u8,
    },
}

/// The rules in force; the default is loopback only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowlist {
    rules: Vec<Rule>,
}

/// A target as the rules see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub scheme: String,
    pub host: String,
    pub port: u16,
    pub path: String,
}

impl Target {
    /// The parts of an absolute `http://` or `https://` URL (the default port of its scheme
    /// when none is given).
    pub fn parse(url: &str) -> Result<Target, String> {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| format!("target {url:?} is not a URL: {e}"))?;
        let scheme = uri.scheme_str().unwrap_or_default().to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return Err(format!("target {url:?} is not an http:// or https:// URL")),
        };
        let host = uri
            .host()
            .ok_or_else(|| format!("target {url:?} has no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        Ok(Target {
            scheme,
            host,
            port: uri.port_u16().unwrap_or(default_port),
            path: uri.path().to_string(),
        })
    }
}

impl Rule {
    pub fn parse(text: &str) -> Result<Rule, String> {
        let bad = |why: &str| {
            Err(format!(
                "--allow-target {text:?}: {why} (e.g. https://*.svc.cluster.local, \
                 http://10.0.0.0/8:50051, http://127.0.0.1)"
            ))
        };
        let Some((scheme, rest)) = text.split_once("://") else {
            return bad("no scheme");
        };
        let scheme = scheme.to_ascii_lowercase();
        if scheme != "http" && scheme != "https" {
            return bad("the scheme must be http or https");
        }
        // The host: `[v6]` or a run up to `:` or `/`; after an address, `/N` is a prefix.
        let (host_text, mut rest) = match rest.strip_prefix('[') {
            Some(inner) => match inner.split_once(']') {
                Some((v6, after)) => (v6.to_string(), after),
                None => return bad("an unclosed ["),
            },
            None => {
                let end = rest.find([':', '/']).unwrap_or(rest.len());
                (rest[..end].to_ascii_lowercase(), &rest[end..])
            }
        };
        let host = match host_text.parse::<IpAddr>() {
            Ok(addr) => {
                let max = if addr.is_ipv4() { 32 } else { 128 };
                let mut prefix = max;
                if let Some(after) = rest.strip_prefix('/') {
                    let digits = after
                        .find(|c: char| !c.is_ascii_digit())
                        .unwrap_or(after.len());
                    if digits > 0 {
                        prefix = match after[..digits].parse::<u8>() {
                            Ok(p) if p <= max => p,
                            _ => return bad("the prefix length is out of range"),
                        };
                        rest = &after[digits..];
                    }
                }
                Host::Net {
                    addr: mask(addr, prefix),
                    prefix,
                }
            }
            Err(_) => {
                let (name, wildcard) = match host_text.strip_prefix("*.") {
                    Some(suffix) => (suffix.to_string(), true),
                    None => (host_text.clone(), false),
                };
                let label_ok = |l: &str| {
                    !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                };
                if name.is_empty() || !name.split('.').all(label_ok) {
                    return bad("the host is not a name, an address or a network");
                }
                Host::Name { name, wildcard }
            }
        };
        let mut port = None;
        if let Some(after) = rest.strip_prefix(':') {
            let end = after.find('/').unwrap_or(after.len());
            port = match after[..end].parse::<u16>() {
                Ok(p) => Some(p),
                Err(_) => return bad("the port is not a number"),
            };
            rest = &after[end..];
        }
        if !rest.is_empty() && !rest.starts_with('/') {
            return bad("unexpected text after the host");
        }
        Ok(Rule {
            scheme,
            host,
            port,
            path: rest.trim_end_matches('/').to_string(),
            text: text.to_string(),
        })
    }

    /// Scheme, port and path (not the host).
    fn matches_rest(&self, target: &Target) -> bool {
        self.scheme == target.scheme
            && self.port.is_none_or(|p| p == target.port)
            && (self.path.is_empty()
                || target.path == self.path
                || target
                    .path
                    .strip_prefix(&self.path)
                    .is_some_and(|rest| rest.starts_with('/')))
    }

    fn contains(&self, addr: IpAddr) -> bool {
        match &self.host {
            Host::Net { addr: net, prefix } => in_net(addr, *net, *prefix),
            Host::Name { .. } => false,
        }
    }

    fn names(&self, host: &str) -> bool {
        match &self.host {
            Host::Name {
                name,
                wildcard: false,
            } => host == name,
            Host::Name {
                name,
                wildcard: true,
            } => host
                .strip_suffix(name.as_str())
                .is_some_and(|before| before.len() > 1 && before.ends_with('.')),
            Host::Net { .. } => false,
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Default for Allowlist {
    /// Loopback only: the README's local run.
    fn default() -> Self {
        let rules = [
            "http://127.0.0.0/8",
            "https://127.0.0.0/8",
            "http://[::1]",
            "https://[::1]",
            "http://localhost",
            "https://localhost",
        ];
        Allowlist {
            rules: rules
                .iter()
                .map(|r| Rule::parse(r).expect("the default rules parse"))
                .collect(),
        }
    }
}

impl Allowlist {
    /// The rules of `--allow-target` (the default, loopback only, when there are none).
    pub fn parse<S: AsRef<str>>(rules: &[S]) -> Result<Allowlist, String> {
        if rules.is_empty() {
            return Ok(Allowlist::default());
        }
        Ok(Allowlist {
            rules: rules
                .iter()
                .map(|r| Rule::parse(r.as_ref()))
                .collect::<Result<_, _>>()?,
        })
    }

    /// The rules, for messages and the start-up line.
    pub fn describe(&self) -> String {
        self.rules
            .iter()
            .map(|r| r.text.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Where a target enters: its URL must match a rule (a name by its text, an address by
    /// its value).
    pub fn check_url(&self, url: &str) -> Result<Target, String> {
        let target = Target::parse(url)?;
        let by_address = target.host.parse::<IpAddr>().ok();
        let allowed = self.rules.iter().any(|r| {
            r.matches_rest(&target)
                && match by_address {
                    Some(addr) => r.contains(addr),
                    None => r.names(&target.host),
                }
        });
        if allowed {
            Ok(target)
        } else {
            Err(self.refusal(url, "matches no rule"))
        }
    }

    /// When a call is made: every address `target`'s host resolved to must be inside an
    /// address rule matching the rest of the target, or public when a name rule matched.
    pub fn check_addresses(&self, target: &Target, addrs: &[IpAddr]) -> Result<(), String> {
        let url = format!("{}://{}:{}", target.scheme, target.host, target.port);
        self.check_resolved(&url, &target.host, Some(target), addrs)
    }

    /// What a connection checks once more as it resolves `host` (only the name is known
    /// there): every address inside some network rule, or public when a name rule names
    /// `host`. Closes the gap between [`Allowlist::check_addresses`] and the connect.
    pub fn check_host_addresses(&self, host: &str, addrs: &[IpAddr]) -> Result<(), String> {
        self.check_resolved(host, host, None, addrs)
    }

    fn check_resolved(
        &self,
        url: &str,
        host: &str,
        target: Option<&Target>,
        addrs: &[IpAddr],
    ) -> Result<(), String> {
        let applies = |r: &Rule| target.is_none_or(|t| r.matches_rest(t));
        let named = self.rules.iter().any(|r| applies(r) && r.names(host));
        if addrs.is_empty() {
            return Err(self.refusal(url, "resolves to no address"));
        }
        for &addr in addrs {
            let inside = self.rules.iter().any(|r| applies(r) && r.contains(addr));
            let allowed = inside || (named && is_public(addr));
            if !allowed {
                return Err(self.refusal(
                    url,
                    &format!("resolves to {addr}, outside the rules (DNS rebinding?)"),
                ));
            }
        }
        Ok(())
    }

    fn refusal(&self, url: &str, why: &str) -> String {
        format!(
            "target {url} {why}: the coordinator calls only --allow-target {}",
            self.describe()
        )
    }
}

fn mask(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let bits = u32::from(a) & u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(bits.into())
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a) & u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(bits.into())
        }
    }
}

fn in_net(addr: IpAddr, net: IpAddr, prefix: u8) -> bool {
    // An IPv4-mapped IPv6 address is its IPv4 address.
    let addr = match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    };
    addr.is_ipv4() == net.is_ipv4() && mask(addr, prefix) == net
}

/// Not loopback, private, link-local (cloud metadata), shared, unique-local, unspecified,
/// multicast or documentation space: an address any host on the internet could have.
pub fn is_public(addr: IpAddr) -> bool {
    let internal: &[&str] = &[
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/3",
        "::/127",
        "fc00::/7",
        "fe80::/10",
        "ff00::/8",
        "2001:db8::/32",
    ];
    let addr = match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    };
    !internal.iter().any(|net| {
        let (a, p) = net.split_once('/').expect("a network");
        let (a, p): (IpAddr, u8) = (a.parse().expect("an address"), p.parse().expect("a prefix"));
        in_net(addr, mask(a, p), p)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(rules: &[&str]) -> Allowlist {
        Allowlist::parse(rules).unwrap()
    }

    #[test]
    fn the_default_is_loopback_only() {
        let l = Allowlist::default();
        assert!(l.check_url("http://127.0.0.1:50051").is_ok());
        assert!(l.check_url("https://[::1]:8443/x").is_ok());
        assert!(l.check_url("http://localhost:9000").is_ok());
        for bad in [
            "http://10.0.0.5:50051",
            "http://169.254.169.254/latest/meta-data",
            "http://internal.example.com",
            "http://localhost.evil.com",
        ] {
            let e = l.check_url(bad).unwrap_err();
            assert!(e.contains("--allow-target http://127.0.0.0/8"), "{e}");
        }
        // localhost must resolve to loopback.
        let t = Target::parse("http://localhost:1").unwrap();
        assert!(
            l.check_addresses(&t, &["127.0.0.1".parse().unwrap()])
                .is_ok()
        );
        assert!(
            l.check_addresses(&t, &["10.1.2.3".parse().unwrap()])
                .is_err()
        );
    }

    #[test]
    fn rules_match_scheme_host_port_and_path() {
        let l = list(&[
            "https://*.svc.cluster.local:443",
            "http://10.0.0.0/8:50051/dtx",
            "http://[fd00::]/8",
            "http://billing",
        ]);
        assert!(l.check_url("https://inv.ns.svc.cluster.local/x").is_ok());
        assert!(
            l.check_url("https://svc.cluster.local/x").is_err(),
            "wildcard needs a label"
        );
        assert!(
            l.check_url("http://inv.ns.svc.cluster.local/x").is_err(),
            "scheme"
        );
        assert!(
            l.check_url("https://inv.svc.cluster.local:8443").is_err(),
            "port"
        );
        assert!(l.check_url("http://10.1.2.3:50051/dtx/branch").is_ok());
        assert!(l.check_url("http://10.1.2.3:50051/dtx").is_ok());
        assert!(
            l.check_url("http://10.1.2.3:50051/dtxevil").is_err(),
            "path boundary"
        );
        assert!(l.check_url("http://10.1.2.3:50052/dtx").is_err());
        assert!(l.check_url("http://11.1.2.3:50051/dtx").is_err());
        assert!(l.check_url("http://[fd12::1]:1").is_ok());
        assert!(l.check_url("http://billing:8080").is_ok());
        assert!(l.check_url("http://billing.evil:8080").is_err());
    }

    #[test]
    fn a_name_reaches_internal_addresses_only_where_their_network_is_allowed() {
        let l = list(&["http://*.internal", "http://10.0.0.0/8"]);
        let t = Target::parse("http://inv.internal:50051").unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(l.check_addresses(&t, &[ip("10.2.3.4")]).is_ok());
        assert!(l.check_addresses(&t, &[ip("93.184.216.34")]).is_ok());
        for rebound in [
            "127.0.0.1",
            "169.254.169.254",
            "192.168.1.1",
            "::ffff:127.0.0.1",
        ] {
            let e = l
                .check_addresses(&t, &[ip("10.2.3.4"), ip(rebound)])
                .unwrap_err();
            assert!(e.contains("DNS rebinding"), "{e}");
        }
        assert!(l.check_addresses(&t, &[]).is_err());
        // At the connection, only the name is known: the same addresses decide.
        assert!(
            l.check_host_addresses("inv.internal", &[ip("10.2.3.4")])
                .is_ok()
        );
        assert!(
            l.check_host_addresses("inv.internal", &[ip("127.0.0.1")])
                .is_err()
        );
        assert!(
            l.check_host_addresses("other.example", &[ip("93.184.216.34")])
                .is_err()
        );
    }

    #[test]
    fn bad_rules_say_why() {
        for (rule, why) in [
            ("10.0.0.0/8", "no scheme"),
            ("ftp://x", "http or https"),
            ("http://10.0.0.0/33", "prefix length"),
            ("http://x:port", "port"),
            ("http://a_b", "not a name"),
            ("http://[::1", "unclosed"),
        ] {
            let e = Rule::parse(rule).unwrap_err();
            assert!(e.contains(why), "{rule}: {e}");
        }
    }
}
