//! Integration tests of porch-api: conversion properties and generated CRDs.

mod cel;
mod conversion;
mod crds;
