//! The wire pieces of native push and fetch (git's pack protocol, v0/v1
//! receive-pack and upload-pack): pkt-lines, the ref advertisement,
//! side-band demultiplexing, the `report-status` answer and the pack of an
//! upload-pack answer, parsed into typed results. Input is untrusted:
//! every length is checked and nothing panics.

use gix::ObjectId;
use std::collections::BTreeSet;

/// Longest pkt-line payload git sends (65520 bytes minus the 4-byte length).
pub const MAX_PKT_DATA: usize = 65516;

/// One pkt-line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet<'a> {
    Data(&'a [u8]),
    /// `0000`
    Flush,
    /// `0001` (protocol v2)
    Delimiter,
    /// `0002` (protocol v2)
    ResponseEnd,
}

/// Malformed protocol input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("pkt-line length {0:?} is not four hex digits")]
    BadLength(String),
    #[error("pkt-line of {0} bytes is longer than 65520")]
    TooLong(usize),
    #[error("pkt-line announces {announced} bytes but only {available} follow")]
    Truncated { announced: usize, available: usize },
    #[error("ref advertisement line {0:?} is not `<id> <ref>`")]
    BadAdvertisement(String),
    #[error("report-status is missing its `unpack` line")]
    NoUnpackLine,
    #[error("report-status line {0:?} is not understood")]
    BadStatus(String),
    #[error("the server reported an error: {0}")]
    Remote(String),
}

/// Encodes one data pkt-line.
///
/// # Errors
/// A payload longer than [`MAX_PKT_DATA`].
pub fn encode(data: &[u8]) -> Result<Vec<u8>, ProtocolError> {
    if data.len() > MAX_PKT_DATA {
        return Err(ProtocolError::TooLong(data.len() + 4));
    }
    let mut out = format!("{:04x}", data.len() + 4).into_bytes();
    out.extend_from_slice(data);
    Ok(out)
}

/// The flush packet.
pub const FLUSH: &[u8] = b"0000";

/// Splits a buffer into pkt-lines; returns the packets and the rest that
/// does not form a whole packet yet.
///
/// # Errors
/// A malformed or oversized length.
pub fn split(mut input: &[u8]) -> Result<(Vec<Packet<'_>>, &[u8]), ProtocolError> {
    let mut packets = Vec::new();
    while input.len() >= 4 {
        let head = &input[..4];
        let text =
            std::str::from_utf8(head).map_err(|_| ProtocolError::BadLength(format!("{head:?}")))?;
        if !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ProtocolError::BadLength(text.to_owned()));
        }
        let len = usize::from_str_radix(text, 16)
            .map_err(|_| ProtocolError::BadLength(text.to_owned()))?;
        match len {
            0 => packets.push(Packet::Flush),
            1 => packets.push(Packet::Delimiter),
            2 => packets.push(Packet::ResponseEnd),
            3 => return Err(ProtocolError::BadLength(text.to_owned())),
            n if n > MAX_PKT_DATA + 4 => return Err(ProtocolError::TooLong(n)),
            n if n > input.len() => return Ok((packets, input)),
            n => packets.push(Packet::Data(&input[4..n])),
        }
        input = &input[len.max(4)..];
    }
    Ok((packets, input))
}

/// Splits a complete message; a trailing partial packet is an error.
///
/// # Errors
/// Malformed, oversized or truncated packets.
pub fn split_all(input: &[u8]) -> Result<Vec<Packet<'_>>, ProtocolError> {
    let (packets, rest) = split(input)?;
    if !rest.is_empty() {
        let announced = std::str::from_utf8(&rest[..rest.len().min(4)])
            .ok()
            .and_then(|t| usize::from_str_radix(t, 16).ok())
            .unwrap_or(rest.len());
        return Err(ProtocolError::Truncated {
            announced,
            available: rest.len(),
        });
    }
    Ok(packets)
}

/// The refs and capabilities a receive-pack server advertises.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Advertisement {
    pub refs: Vec<(String, ObjectId)>,
    pub capabilities: BTreeSet<String>,
}

/// Parses a v0/v1 ref advertisement, with or without the smart-HTTP
/// `# service=git-receive-pack` preamble. An empty repository advertises
/// `capabilities^{}` with the zero id; that is not a ref.
///
/// # Errors
/// Malformed packets or lines.
pub fn parse_advertisement(input: &[u8]) -> Result<Advertisement, ProtocolError> {
    let mut advertisement = Advertisement::default();
    let mut first = true;
    for packet in split_all(input)? {
        let Packet::Data(line) = packet else { continue };
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        if line.starts_with(b"# service=") || line.starts_with(b"version ") {
            continue;
        }
        let (refpart, caps) = match line.iter().position(|b| *b == 0) {
            Some(i) => (&line[..i], Some(&line[i + 1..])),
            None => (line, None),
        };
        if first {
            if let Some(caps) = caps {
                advertisement.capabilities = String::from_utf8_lossy(caps)
                    .split_ascii_whitespace()
                    .map(str::to_owned)
                    .collect();
            }
            first = false;
        }
        let text = String::from_utf8_lossy(refpart);
        let (id, name) = text
            .split_once(' ')
            .ok_or_else(|| ProtocolError::BadAdvertisement(text.chars().take(200).collect()))?;
        let id = ObjectId::from_hex(id.as_bytes())
            .map_err(|_| ProtocolError::BadAdvertisement(text.chars().take(200).collect()))?;
        if name == "capabilities^{}" {
            continue;
        }
        advertisement.refs.push((name.to_owned(), id));
    }
    Ok(advertisement)
}

/// Demultiplexes side-band-64k packets: band 1 is the data, band 2
/// progress (dropped), band 3 a fatal error.
///
/// # Errors
/// Malformed packets, an unknown band, or a band-3 error from the server.
pub fn demux_sideband(input: &[u8]) -> Result<Vec<u8>, ProtocolError> {
    let mut data = Vec::new();
    for packet in split_all(input)? {
        let Packet::Data(payload) = packet else {
            continue;
        };
        match payload.split_first() {
            Some((1, rest)) => data.extend_from_slice(rest),
            Some((2, _)) => {}
            Some((3, rest)) => {
                return Err(ProtocolError::Remote(
                    String::from_utf8_lossy(rest).trim().to_owned(),
                ));
            }
            _ => {
                return Err(ProtocolError::BadStatus(
                    String::from_utf8_lossy(payload).chars().take(200).collect(),
                ));
            }
        }
    }
    Ok(data)
}

/// Why the server refused one ref update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefRejection {
    NonFastForward,
    /// The old id we sent is not the ref's current value (someone moved it).
    Stale,
    AlreadyExists,
    HookDeclined,
    /// Another ref of an atomic push failed (or the transaction as a whole
    /// lost a lock race on the server), so this one was not applied either.
    AtomicTransactionFailed,
    Other(String),
}

/// The answer to a push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportStatus {
    /// `None` when the pack was unpacked, else the server's reason.
    pub unpack_error: Option<String>,
    pub refs: Vec<(String, Result<(), RefRejection>)>,
}

impl ReportStatus {
    /// Whether the pack and every ref were accepted.
    pub fn all_ok(&self) -> bool {
        self.unpack_error.is_none() && self.refs.iter().all(|(_, r)| r.is_ok())
    }
}

fn rejection(reason: &str) -> RefRejection {
    let lower = reason.to_ascii_lowercase();
    if lower.contains("non-fast-forward") || lower.contains("non-fast forward") {
        RefRejection::NonFastForward
    } else if lower.contains("stale info")
        || lower.contains("fetch first")
        || lower.contains("failed to lock")
        || lower.contains("cannot lock ref")
    {
        RefRejection::Stale
    } else if lower.contains("already exists") {
        RefRejection::AlreadyExists
    } else if lower.contains("atomic transaction failed") || lower.contains("atomic push failed") {
        RefRejection::AtomicTransactionFailed
    } else if lower.contains("hook declined") {
        RefRejection::HookDeclined
    } else {
        RefRejection::Other(reason.to_owned())
    }
}

/// Parses `report-status` (after side-band demultiplexing, if any):
/// `unpack ok|<reason>`, then `ok <ref>` / `ng <ref> <reason>` lines.
///
/// # Errors
/// Malformed packets, no `unpack` line, or an unknown line.
pub fn parse_report_status(input: &[u8]) -> Result<ReportStatus, ProtocolError> {
    let mut unpack = None;
    let mut refs = Vec::new();
    for packet in split_all(input)? {
        let Packet::Data(line) = packet else { continue };
        let text = String::from_utf8_lossy(line);
        let text = text.trim_end_matches('\n');
        if let Some(rest) = text.strip_prefix("unpack ") {
            unpack = Some((rest != "ok").then(|| rest.to_owned()));
        } else if let Some(name) = text.strip_prefix("ok ") {
            refs.push((name.to_owned(), Ok(())));
        } else if let Some(rest) = text.strip_prefix("ng ") {
            let (name, reason) = rest.split_once(' ').unwrap_or((rest, ""));
            refs.push((name.to_owned(), Err(rejection(reason))));
        } else if text.starts_with("option ") {
            // report-status-v2 extra lines about the ref just named
        } else {
            return Err(ProtocolError::BadStatus(text.chars().take(200).collect()));
        }
    }
    Ok(ReportStatus {
        unpack_error: unpack.ok_or(ProtocolError::NoUnpackLine)?,
        refs,
    })
}

/// The pack in an upload-pack answer: acknowledgements first, then the
/// side-band stream.
///
/// # Errors
/// Malformed packets, an unknown band, an `ERR` line or a band-3 error
/// from the server, or no pack at all.
pub fn pack_from_answer(answer: &[u8]) -> Result<Vec<u8>, ProtocolError> {
    // a server without side-band sends the pack raw after the
    // acknowledgements
    let mut rest = answer;
    while let Some(head) = rest.get(..4) {
        if head == b"PACK" {
            return Ok(rest.to_vec());
        }
        let len = std::str::from_utf8(head)
            .ok()
            .and_then(|h| usize::from_str_radix(h, 16).ok());
        match len {
            Some(len) if len > 4 && len <= rest.len() => {
                let data = &rest[4..len];
                if data.starts_with(b"NAK") || data.starts_with(b"ACK ") {
                    rest = &rest[len..];
                    continue;
                }
                break;
            }
            _ => break,
        }
    }
    let packets = split_all(rest)?;
    let mut pack = Vec::new();
    for packet in packets {
        let Packet::Data(data) = packet else { continue };
        if data.starts_with(b"NAK") || data.starts_with(b"ACK ") {
            continue;
        }
        if let Some(message) = data.strip_prefix(b"ERR ") {
            return Err(ProtocolError::Remote(
                String::from_utf8_lossy(message).trim().to_owned(),
            ));
        }
        match data.split_first() {
            Some((1, rest)) => pack.extend_from_slice(rest),
            Some((2, _)) => {}
            Some((3, rest)) => {
                return Err(ProtocolError::Remote(
                    String::from_utf8_lossy(rest).trim().to_owned(),
                ));
            }
            _ => {
                return Err(ProtocolError::BadStatus(
                    String::from_utf8_lossy(data).chars().take(200).collect(),
                ));
            }
        }
    }
    if pack.len() < 32 || !pack.starts_with(b"PACK") {
        return Err(ProtocolError::BadStatus("the answer holds no pack".into()));
    }
    Ok(pack)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkts(lines: &[&str]) -> Vec<u8> {
        let mut out = Vec::new();
        for line in lines {
            if *line == "0000" {
                out.extend_from_slice(FLUSH);
            } else {
                out.extend(encode(line.as_bytes()).expect("encode"));
            }
        }
        out
    }

    #[test]
    fn encodes_and_splits() {
        assert_eq!(encode(b"hi\n").expect("encode"), b"0007hi\n");
        let buf = pkts(&["a\n", "0000", "bc"]);
        let (packets, rest) = split(&buf).expect("split");
        assert_eq!(
            packets,
            vec![Packet::Data(b"a\n"), Packet::Flush, Packet::Data(b"bc")]
        );
        assert!(rest.is_empty());
        // a partial packet is left for later, and is an error at the end
        let (packets, rest) = split(b"0009abc").expect("partial");
        assert!(packets.is_empty());
        assert_eq!(rest, b"0009abc");
        assert!(matches!(
            split_all(b"0009abc"),
            Err(ProtocolError::Truncated { .. })
        ));
    }

    #[test]
    fn hostile_lengths_are_errors() {
        assert!(matches!(
            split(b"zzzzdata"),
            Err(ProtocolError::BadLength(_))
        ));
        assert!(matches!(split(b"0003"), Err(ProtocolError::BadLength(_))));
        assert!(matches!(split(b"fff5xxxx"), Err(ProtocolError::TooLong(_))));
        assert!(matches!(
            split(&[0xff, 0xfe, 0, 1]),
            Err(ProtocolError::BadLength(_))
        ));
        assert!(encode(&vec![0u8; MAX_PKT_DATA + 1]).is_err());
    }

    #[test]
    fn reads_a_smart_http_advertisement() {
        let a = "1111111111111111111111111111111111111111";
        let b = "2222222222222222222222222222222222222222";
        let input = pkts(&[
            "# service=git-receive-pack\n",
            "0000",
            &format!(
                "{a} refs/heads/main\0report-status report-status-v2 delete-refs side-band-64k quiet atomic ofs-delta object-format=sha1 agent=git/2.47.3\n"
            ),
            &format!("{b} refs/tags/basens/v1\n"),
            "0000",
        ]);
        let adv = parse_advertisement(&input).expect("parse");
        assert_eq!(adv.refs.len(), 2);
        assert_eq!(adv.refs[1].0, "refs/tags/basens/v1");
        assert!(adv.capabilities.contains("atomic"));
        assert!(adv.capabilities.contains("report-status"));
        // an empty repository
        let zero = "0000000000000000000000000000000000000000";
        let empty = pkts(&[
            &format!("{zero} capabilities^{{}}\0report-status delete-refs\n"),
            "0000",
        ]);
        let adv = parse_advertisement(&empty).expect("empty");
        assert!(adv.refs.is_empty());
        assert!(adv.capabilities.contains("delete-refs"));
        assert!(parse_advertisement(&pkts(&["not a ref line\n"])).is_err());
    }

    #[test]
    fn reads_report_status_with_typed_rejections() {
        let status = pkts(&[
            "unpack ok\n",
            "ok refs/heads/main\n",
            "ng refs/tags/basens/v3 already exists\n",
            "ng refs/heads/drafts/a/ws non-fast-forward\n",
            "ng refs/heads/proposed/a/ws stale info\n",
            "ng refs/heads/x pre-receive hook declined\n",
            "ng refs/heads/y funny refname\n",
            "ng refs/heads/z atomic transaction failed\n",
            "0000",
        ]);
        let report = parse_report_status(&status).expect("parse");
        assert_eq!(report.unpack_error, None);
        assert!(!report.all_ok());
        let reasons: Vec<_> = report.refs.iter().map(|(_, r)| r.clone()).collect();
        assert_eq!(
            reasons,
            vec![
                Ok(()),
                Err(RefRejection::AlreadyExists),
                Err(RefRejection::NonFastForward),
                Err(RefRejection::Stale),
                Err(RefRejection::HookDeclined),
                Err(RefRejection::Other("funny refname".into())),
                Err(RefRejection::AtomicTransactionFailed),
            ]
        );
        let failed = parse_report_status(&pkts(&["unpack index-pack abnormal exit\n", "0000"]))
            .expect("parse");
        assert_eq!(
            failed.unpack_error.as_deref(),
            Some("index-pack abnormal exit")
        );
        assert!(matches!(
            parse_report_status(&pkts(&["ok refs/heads/main\n"])),
            Err(ProtocolError::NoUnpackLine)
        ));
        assert!(matches!(
            parse_report_status(&pkts(&["unpack ok\n", "what?\n"])),
            Err(ProtocolError::BadStatus(_))
        ));
    }

    #[test]
    fn demultiplexes_side_bands() {
        let inner = pkts(&["unpack ok\n", "ok refs/heads/main\n", "0000"]);
        let mut muxed = Vec::new();
        muxed.extend(encode(b"\x02Resolving deltas: 100%\n").expect("progress"));
        let mut band1 = vec![1u8];
        band1.extend_from_slice(&inner);
        muxed.extend(encode(&band1).expect("data"));
        muxed.extend_from_slice(FLUSH);
        let data = demux_sideband(&muxed).expect("demux");
        assert!(parse_report_status(&data).expect("status").all_ok());
        let mut error = Vec::new();
        error.extend(encode(b"\x03fatal: the remote end hung up\n").expect("err"));
        assert_eq!(
            demux_sideband(&error),
            Err(ProtocolError::Remote(
                "fatal: the remote end hung up".into()
            ))
        );
        assert!(demux_sideband(&encode(b"\x07?").expect("bad band")).is_err());
    }
}
