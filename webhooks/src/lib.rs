//! Admission and conversion webhooks for PackageRevision.
