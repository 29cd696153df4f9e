//! Git wire answers and the snapshot manifest: untrusted bytes parse to a
//! value or a clear error, and what parses encodes back to the same value.

use porch_git::pktline::{
    self, Advertisement, FLUSH, Packet, RefRejection, ReportStatus, parse_advertisement,
    parse_report_status,
};
use porch_git::snapshot::Manifest;

fn encode_packets(packets: &[Packet<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for packet in packets {
        match packet {
            Packet::Data(data) => {
                out.extend(pktline::encode(data).expect("a split packet fits a pkt-line"));
            }
            Packet::Flush => out.extend_from_slice(FLUSH),
            Packet::Delimiter => out.extend_from_slice(b"0001"),
            Packet::ResponseEnd => out.extend_from_slice(b"0002"),
        }
    }
    out
}

/// Equal up to the case of the hex digits of each length.
fn same_stream(original: &[u8], encoded: &[u8]) {
    assert_eq!(
        original.len(),
        encoded.len(),
        "re-encoding changed the length"
    );
    let packets = pktline::split_all(encoded).expect("an encoded stream splits");
    let mut at = 0;
    for packet in packets {
        let len = match packet {
            Packet::Data(data) => data.len() + 4,
            _ => 4,
        };
        assert!(
            original[at..at + 4].eq_ignore_ascii_case(&encoded[at..at + 4]),
            "length at {at} differs"
        );
        assert_eq!(original[at + 4..at + len], encoded[at + 4..at + len]);
        at += len;
    }
}

fn encode_lines(lines: &[Vec<u8>]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    for line in lines {
        out.extend(pktline::encode(line).ok()?);
    }
    out.extend_from_slice(FLUSH);
    Some(out)
}

fn encode_advertisement(advertisement: &Advertisement) -> Option<Vec<u8>> {
    let caps: Vec<&str> = advertisement
        .capabilities
        .iter()
        .map(String::as_str)
        .collect();
    let mut lines = Vec::new();
    let zero = "0".repeat(40);
    let refs: Vec<(String, String)> = if advertisement.refs.is_empty() && !caps.is_empty() {
        vec![(zero, "capabilities^{}".to_owned())]
    } else {
        advertisement
            .refs
            .iter()
            .map(|(name, id)| (id.to_string(), name.clone()))
            .collect()
    };
    for (i, (id, name)) in refs.iter().enumerate() {
        let mut line = format!("{id} {name}").into_bytes();
        if i == 0 && !caps.is_empty() {
            line.push(0);
            line.extend_from_slice(caps.join(" ").as_bytes());
        }
        line.push(b'\n');
        lines.push(line);
    }
    encode_lines(&lines)
}

fn reason(rejection: &RefRejection) -> &str {
    match rejection {
        RefRejection::NonFastForward => "non-fast-forward",
        RefRejection::Stale => "stale info",
        RefRejection::AlreadyExists => "already exists",
        RefRejection::HookDeclined => "hook declined",
        RefRejection::AtomicTransactionFailed => "atomic transaction failed",
        RefRejection::Other(reason) => reason,
    }
}

fn encode_report(report: &ReportStatus) -> Option<Vec<u8>> {
    let mut lines = vec![match &report.unpack_error {
        None => b"unpack ok\n".to_vec(),
        Some(error) => format!("unpack {error}\n").into_bytes(),
    }];
    for (name, result) in &report.refs {
        lines.push(
            match result {
                Ok(()) => format!("ok {name}\n"),
                Err(rejection) => format!("ng {name} {}\n", reason(rejection)),
            }
            .into_bytes(),
        );
    }
    encode_lines(&lines)
}

/// Every parser of git answers on the same bytes: a stream that splits
/// re-encodes to itself; an advertisement and a report-status that parse
/// encode back to what parses to the same value; the upload-pack answer
/// parser gives a pack or an error.
pub fn pktline(data: &[u8]) {
    if let Ok((packets, rest)) = pktline::split(data) {
        let mut encoded = encode_packets(&packets);
        encoded.extend_from_slice(rest);
        if rest.is_empty() {
            same_stream(data, &encoded);
        } else {
            assert_eq!(encoded.len(), data.len());
            same_stream(
                &data[..data.len() - rest.len()],
                &encoded[..encoded.len() - rest.len()],
            );
        }
    }
    if let Ok(advertisement) = parse_advertisement(data)
        && let Some(encoded) = encode_advertisement(&advertisement)
    {
        let again = parse_advertisement(&encoded)
            .unwrap_or_else(|e| panic!("an encoded advertisement does not parse: {e}"));
        assert_eq!(again, advertisement);
    }
    if let Ok(report) = parse_report_status(data)
        && let Some(encoded) = encode_report(&report)
    {
        let again = parse_report_status(&encoded)
            .unwrap_or_else(|e| panic!("an encoded report-status does not parse: {e}"));
        assert_eq!(again, report);
    }
    if let Ok(band) = pktline::demux_sideband(data) {
        let _ = parse_report_status(&band);
    }
    if let Ok(pack) = pktline::pack_from_answer(data) {
        assert!(
            pack.starts_with(b"PACK"),
            "a pack that does not start with PACK"
        );
    }
}

/// A manifest that decodes encodes, and decodes again to the same value;
/// every ref it lists is a branch or tag with an object id.
pub fn snapshot_manifest(data: &[u8]) {
    let Ok(manifest) = Manifest::decode(data) else {
        return;
    };
    for name in manifest.refs.keys().chain(&manifest.deleted) {
        assert!(
            name.starts_with("refs/heads/") || name.starts_with("refs/tags/"),
            "{name:?} is neither a branch nor a tag"
        );
    }
    assert_eq!(
        manifest.ref_ids().len(),
        manifest.refs.len(),
        "a listed ref has no object id"
    );
    let encoded = serde_json::to_vec(&manifest).expect("a manifest encodes");
    let again = Manifest::decode(&encoded)
        .unwrap_or_else(|e| panic!("an encoded manifest does not decode: {e}"));
    assert_eq!(again, manifest);
}
