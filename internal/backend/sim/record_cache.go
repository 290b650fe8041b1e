package sim

import (
	"os"
	"syscall"
	"time"
)

// A node asks its backend what runs four times a second. Reading and
// decoding every instance's record each time was the largest part of a
// hollow node's CPU once it held thousands of instances
// (docs/benchmarks.md), on the same cores as the control plane the
// benchmarks measure. So a Backend keeps the records it decoded, each
// with the identity of the file it came from, and reads a record again
// only when its file is another: save renames a new file into place, so a
// write by any Backend over the same directory shows as a new inode.

// fileID is what tells one record file from the next.
type fileID struct {
	ino   uint64
	size  int64
	mtime time.Time
}

func idOf(fi os.FileInfo) fileID {
	id := fileID{size: fi.Size(), mtime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id.ino = st.Ino
	}
	return id
}

type cachedRecord struct {
	file fileID
	r    record
}

// cached returns id's record as decoded from the file fi describes, if the
// cache has it (callers hold b.mu).
func (b *Backend) cached(id string, fi os.FileInfo) (record, bool) {
	c, ok := b.records[id]
	if !ok || c.file != idOf(fi) {
		return record{}, false
	}
	return c.r, true
}

// remember caches r as decoded from the file fi describes (callers hold
// b.mu).
func (b *Backend) remember(id string, fi os.FileInfo, r record) {
	if b.records == nil {
		b.records = map[string]cachedRecord{}
	}
	b.records[id] = cachedRecord{file: idOf(fi), r: r}
}
