//! Opening the cache device: a preallocated regular file or a raw block device, with O_DIRECT
//! where the filesystem allows it.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// An open device and how it was opened.
pub(crate) struct Device {
    pub(crate) file: File,
    /// Usable bytes.
    pub(crate) capacity: u64,
    /// Whether O_DIRECT is in effect (false on filesystems that refuse it, such as tmpfs).
    pub(crate) direct: bool,
    /// A buffered handle for demand reads through the page cache, when asked for.
    pub(crate) buffered: Option<File>,
}

fn open(path: &Path, direct: bool) -> io::Result<File> {
    let mut o = OpenOptions::new();
    // Read and write: io_uring and pread need a readable handle, which File::create is not.
    o.read(true).write(true).create(true).truncate(false);
    #[cfg(target_os = "linux")]
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path)
}

/// Open `path` for `capacity` bytes. A regular file is created and preallocated (so writes later
/// cannot fail for lack of space); a block device is used up to its size. With `page_cache`, a
/// second handle without O_DIRECT is opened for reads.
pub(crate) fn open_device(
    path: &Path,
    capacity: u64,
    direct: bool,
    page_cache: bool,
) -> io::Result<Device> {
    let (mut file, direct) = match open(path, direct) {
        Ok(f) => (f, direct),
        Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
            tracing::warn!(
                path = %path.display(),
                "O_DIRECT refused by this filesystem; using buffered I/O (the page cache will hold \
                 a second copy of hot blocks)"
            );
            (open(path, false)?, false)
        }
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    let capacity = if meta.file_type().is_block_device() {
        let size = file.seek(SeekFrom::End(0))?;
        file.seek(SeekFrom::Start(0))?;
        if capacity > size {
            tracing::warn!(
                capacity,
                size,
                "disk capacity exceeds the device; using the device size"
            );
        }
        capacity.min(size)
    } else {
        if meta.len() != capacity {
            file.set_len(capacity)?;
        }
        preallocate(&file, capacity);
        capacity
    };
    let buffered = match (page_cache, direct) {
        (false, _) => None,
        // Read-only: this handle never writes, so it can never write around O_DIRECT.
        (true, true) => Some(OpenOptions::new().read(true).open(path)?),
        // Buffered already: the one handle serves both.
        (true, false) => Some(file.try_clone()?),
    };
    Ok(Device {
        file,
        capacity,
        direct,
        buffered,
    })
}

fn preallocate(file: &File, len: u64) {
    // Best effort: a filesystem without fallocate still works, with a sparse file.
    if let Err(e) = rustix::fs::fallocate(file, rustix::fs::FallocateFlags::KEEP_SIZE, 0, len) {
        tracing::debug!(error = %e, "fallocate not supported; the cache file stays sparse");
    }
}
