//! `cudasim-pidd SOCKET`: the simulator's stand-in for the kernel's view of pids. Serves a unix socket at SOCKET
//! (mode 0666, replacing a stale one) that answers every connection with the connecting process's pid as this
//! server's pid namespace knows it (`SO_PEERCRED`): run on the host and mounted into a container with
//! `CUDASIM_PID_SOCKET` naming it, it lets the simulated NVML report host pids, as NVIDIA's does. Runs until
//! killed.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};

/// The peer's pid in our pid namespace.
fn peer_pid(s: &UnixStream) -> std::io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a connected socket we own; `cred` and `len` are valid for the kernel to write.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // 0: the peer is in a pid namespace this one cannot see.
    u32::try_from(cred.pid)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| std::io::Error::other("the peer's pid is not visible in this pid namespace"))
}

fn main() {
    let Some(path) = std::env::args_os().nth(1) else {
        eprintln!("usage: cudasim-pidd SOCKET");
        std::process::exit(2);
    };
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap_or_else(|e| {
        eprintln!("cudasim-pidd: cannot bind {}: {e}", path.to_string_lossy());
        std::process::exit(1);
    });
    // Any user in the container may ask, as any process may use the driver.
    if let Err(e) = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)) {
        eprintln!("cudasim-pidd: {}: {e}", path.to_string_lossy());
        std::process::exit(1);
    }
    for conn in listener.incoming() {
        let Ok(mut s) = conn else { continue };
        match peer_pid(&s) {
            Ok(pid) => {
                let _ = writeln!(s, "{pid}");
            }
            Err(e) => eprintln!("cudasim-pidd: {e}"),
        }
    }
}
