//! The pid NVML knows a process by, in a container. NVIDIA's kernel module sees every process by its pid in the
//! initial pid namespace, so NVML reports host pids even when called from a container; a process in a child
//! namespace with its own `/proc` cannot see that pid. The simulator asks the "kernel" instead: a unix socket
//! (`CUDASIM_PID_SOCKET`, served on the host by `cudasim-pidd`, see `bin/cudasim-pidd.rs`) whose server answers
//! each connection with the peer's pid from `SO_PEERCRED`, which the kernel translates into the server's pid
//! namespace.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// Asks the pid service at `socket` for this process's host pid.
pub(crate) fn host_pid(socket: &str) -> Result<u32, String> {
    let fail = |e: &dyn std::fmt::Display| {
        format!("cudasim: CUDASIM_PID_SOCKET={socket}: {e} (is cudasim-pidd serving it on the host?)")
    };
    let mut s = UnixStream::connect(socket).map_err(|e| fail(&e))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| fail(&e))?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| fail(&e))?;
    match text.trim().parse::<u32>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(fail(&format!("answered {text:?}, not a pid"))),
    }
}
