//! Integration tests of porch-api: conversion properties and generated CRDs.

mod conversion;
mod crds;
