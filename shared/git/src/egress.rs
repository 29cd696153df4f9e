//! Where a remote may connect: the guard against server-side request
//! forgery for URLs that users, not administrators, choose (a clone's
//! `cloneFrom.git.repo`).
//!
//! A guarded remote refuses every address a workload should not reach from
//! a user's URL: loopback, link-local (the cloud metadata service at
//! `169.254.169.254` among them), private and shared ranges, unspecified,
//! multicast and broadcast addresses, and the IPv6 forms that embed them
//! (IPv4-mapped, NAT64). Names are checked where they are resolved, for
//! every connection, so a name that resolves to a private address, a
//! redirect to one and a name that changes its answer between check and
//! connect (DNS rebinding) are all refused: the connection only ever goes
//! to an address that passed. An allowlist opens networks, hosts or local
//! paths again.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// Why an address may not be reached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{target} is not allowed: {reason} (allow it with PORCH_CLONE_ALLOW)")]
pub struct Denied {
    pub target: String,
    pub reason: &'static str,
}

/// A network in CIDR form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Net {
    address: IpAddr,
    prefix: u8,
}

impl Net {
    /// # Errors
    /// Not `address/prefix` or a bare address, or a prefix too long.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (address, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let address: IpAddr = address
            .parse()
            .map_err(|_| format!("{text:?} is not an IP address or network"))?;
        let max = if address.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{text:?}: the prefix must be 0 to {max}"))?,
        };
        Ok(Self { address, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.address, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// Which destinations a guarded remote may reach.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    /// Everything is allowed (a local tool, an administrator's Repository).
    unrestricted: bool,
    /// `file://` URLs and absolute paths on the handler's own disk.
    local_paths: bool,
    networks: Vec<Net>,
    /// Host names allowed whatever they resolve to (lower case).
    hosts: Vec<String>,
}

impl fmt::Debug for EgressPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.unrestricted {
            return f.write_str("EgressPolicy(*)");
        }
        f.debug_struct("EgressPolicy")
            .field("local_paths", &self.local_paths)
            .field("networks", &self.networks)
            .field("hosts", &self.hosts)
            .finish()
    }
}

impl EgressPolicy {
    /// Public addresses only: the default for URLs users choose.
    pub fn public_only() -> Self {
        Self::default()
    }

    /// No checks at all.
    pub fn unrestricted() -> Self {
        Self {
            unrestricted: true,
            ..Self::default()
        }
    }

    /// Public addresses plus an allowlist: comma-separated entries, each a
    /// network (`10.0.0.0/8`), an address (`127.0.0.1`, `::1`), a host name
    /// (`git.internal.example`), `file` (local paths) or `*` (everything).
    ///
    /// # Errors
    /// An entry that is none of these.
    pub fn with_allowlist(text: &str) -> Result<Self, String> {
        let mut policy = Self::public_only();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if entry == "*" {
                policy.unrestricted = true;
            } else if entry == "file" {
                policy.local_paths = true;
            } else if entry.contains('/') || entry.parse::<IpAddr>().is_ok() {
                policy.networks.push(Net::parse(entry)?);
            } else if is_host_name(entry) {
                policy.hosts.push(entry.to_ascii_lowercase());
            } else {
                return Err(format!(
                    "{entry:?} is not a network, an address, a host name, `file` or `*`"
                ));
            }
        }
        Ok(policy)
    }

    pub fn is_unrestricted(&self) -> bool {
        self.unrestricted
    }

    /// # Errors
    /// Local paths are not allowed.
    pub fn check_local_path(&self, path: &str) -> Result<(), Denied> {
        if self.unrestricted || self.local_paths {
            return Ok(());
        }
        Err(Denied {
            target: path.to_owned(),
            reason: "local paths are not allowed as clone sources",
        })
    }

    /// Whether a host name is allowed whatever it resolves to.
    pub fn allows_host(&self, host: &str) -> bool {
        self.unrestricted || {
            let host = host.trim_end_matches('.').to_ascii_lowercase();
            self.hosts.contains(&host)
        }
    }

    /// # Errors
    /// The address is in a refused range and no allowlisted network holds it.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Denied> {
        if self.unrestricted || self.networks.iter().any(|n| n.contains(ip)) {
            return Ok(());
        }
        match refused_range(ip) {
            None => Ok(()),
            Some(reason) => Err(Denied {
                target: ip.to_string(),
                reason,
            }),
        }
    }

    /// Checks a URL's host when it is an address; names are checked when
    /// they are resolved.
    ///
    /// # Errors
    /// The address is refused.
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), Denied> {
        match url
            .host_str()
            .and_then(|h| h.trim_matches(['[', ']']).parse::<IpAddr>().ok())
        {
            Some(ip) => self.check_ip(ip),
            None => Ok(()),
        }
    }

    /// Resolves `host` and keeps the addresses allowed.
    ///
    /// # Errors
    /// The name does not resolve, or resolves only to refused addresses.
    pub async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, ResolveError> {
        if let Ok(ip) = host.trim_matches(['[', ']']).parse::<IpAddr>() {
            self.check_ip(ip)
                .map_err(|e| ResolveError::Refused(Refused(e.to_string())))?;
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let found: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| ResolveError::Lookup(format!("cannot resolve {host}: {e}")))?
            .collect();
        if self.allows_host(host) {
            return Ok(found);
        }
        let mut denied = None;
        let allowed: Vec<SocketAddr> = found
            .into_iter()
            .filter(|a| match self.check_ip(a.ip()) {
                Ok(()) => true,
                Err(e) => {
                    denied.get_or_insert(e);
                    false
                }
            })
            .collect();
        match (allowed.is_empty(), denied) {
            (false, _) => Ok(allowed),
            (true, Some(denied)) => Err(ResolveError::Refused(Refused(format!(
                "{host} resolves to {denied}"
            )))),
            (true, None) => Err(ResolveError::Lookup(format!("{host} has no addresses"))),
        }
    }
}

fn is_host_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 253
        && text.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// The range an address is refused for, if any.
fn refused_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => refused_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return refused_v4(v4).map(|_| "an IPv4-mapped address of a refused range");
            }
            let segments = v6.segments();
            // NAT64 (64:ff9b::/96) embeds an IPv4 address in its low bits.
            if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let bits = u128::from(v6) as u32;
                return refused_v4(Ipv4Addr::from(bits))
                    .map(|_| "a NAT64 address of a refused range");
            }
            refused_v6(v6)
        }
    }
}

fn refused_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    if ip.is_loopback() {
        Some("a loopback address")
    } else if ip.is_link_local() {
        Some("a link-local address (the cloud metadata service among them)")
    } else if ip.is_private() {
        Some("a private address")
    } else if a == 100 && (64..128).contains(&b) {
        Some("a shared (carrier-grade NAT) address")
    } else if a == 0 || ip.is_unspecified() {
        Some("an unspecified address")
    } else if ip.is_multicast() || ip.is_broadcast() || a >= 240 {
        Some("a multicast, broadcast or reserved address")
    } else if a == 192 && b == 0 && ip.octets()[2] == 0 {
        Some("an IETF protocol address")
    } else {
        None
    }
}

fn refused_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    if ip.is_loopback() {
        Some("a loopback address")
    } else if ip.is_unspecified() {
        Some("an unspecified address")
    } else if first & 0xffc0 == 0xfe80 {
        Some("a link-local address")
    } else if first & 0xfe00 == 0xfc00 {
        Some("a unique local (private) address")
    } else if first & 0xffc0 == 0xfec0 {
        Some("a site-local address")
    } else if ip.is_multicast() {
        Some("a multicast address")
    } else {
        None
    }
}

/// A name the resolver would not hand out: it resolves to refused
/// addresses only.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// Why a name gave no address to connect to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error(transparent)]
    Refused(Refused),
    /// The lookup failed (perhaps for a while: worth another try).
    #[error("{0}")]
    Lookup(String),
}

/// A resolver for the HTTP client that hands out allowed addresses only.
#[derive(Debug, Clone)]
pub(crate) struct GuardedResolver(pub(crate) Arc<EgressPolicy>);

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = Arc::clone(&self.0);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addresses = policy.resolve(&host, 0).await.map_err(
                |e| -> Box<dyn std::error::Error + Send + Sync> {
                    match e {
                        ResolveError::Refused(refused) => Box::new(refused),
                        ResolveError::Lookup(message) => Box::new(std::io::Error::other(message)),
                    }
                },
            )?;
            let addresses: reqwest::dns::Addrs = Box::new(addresses.into_iter());
            Ok(addresses)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str) -> bool {
        EgressPolicy::public_only()
            .check_ip(text.parse().expect("an address"))
            .is_err()
    }

    #[test]
    fn refuses_internal_ranges() {
        for ip in [
            "169.254.169.254",
            "127.0.0.1",
            "127.1.2.3",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "::ffff:169.254.169.254",
            "::ffff:10.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "ff02::1",
        ] {
            assert!(refused(ip), "{ip} should be refused");
        }
        for ip in [
            "8.8.8.8",
            "140.82.112.3",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "64:ff9b::808:808",
        ] {
            assert!(!refused(ip), "{ip} should be allowed");
        }
    }

    #[test]
    fn allowlists_open_networks_hosts_and_paths() {
        let policy = EgressPolicy::with_allowlist("10.1.0.0/16, 127.0.0.1 ,git.corp.example,file")
            .expect("allowlist");
        assert!(policy.check_ip("10.1.2.3".parse().expect("ip")).is_ok());
        assert!(policy.check_ip("10.2.0.1".parse().expect("ip")).is_err());
        assert!(policy.check_ip("127.0.0.1".parse().expect("ip")).is_ok());
        assert!(policy.check_ip("127.0.0.2".parse().expect("ip")).is_err());
        assert!(policy.allows_host("GIT.corp.example."));
        assert!(!policy.allows_host("corp.example"));
        assert!(policy.check_local_path("/srv/git").is_ok());
        assert!(
            EgressPolicy::public_only()
                .check_local_path("/tmp/porch/mirrors/x")
                .is_err()
        );
        assert!(
            EgressPolicy::with_allowlist("*")
                .expect("star")
                .check_ip("169.254.169.254".parse().expect("ip"))
                .is_ok()
        );
        for bad in [
            "10.0.0.0/33",
            "::1/129",
            "a b",
            "http://x",
            "-x.example",
            "1.2.3.4/x",
        ] {
            assert!(EgressPolicy::with_allowlist(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn names_resolving_to_refused_addresses_are_refused() {
        let policy = EgressPolicy::public_only();
        let error = policy
            .resolve("localhost", 80)
            .await
            .expect_err("refused")
            .to_string();
        assert!(error.contains("localhost resolves to"), "{error}");
        assert!(error.contains("loopback"), "{error}");
        let allowed = EgressPolicy::with_allowlist("localhost").expect("allowlist");
        assert!(
            !allowed
                .resolve("localhost", 80)
                .await
                .expect("allowed")
                .is_empty()
        );
        let error = policy
            .resolve("[::1]", 80)
            .await
            .expect_err("refused")
            .to_string();
        assert!(error.contains("::1 is not allowed"), "{error}");
    }
}
