//! Integration-test harness for cuquota.
