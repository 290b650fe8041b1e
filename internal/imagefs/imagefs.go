// Package imagefs is the contract between the node, which turns an OCI
// image into one read-only filesystem (internal/images), and the guest,
// which boots it (hack/guest/init and the guest agent): where the image's
// files and its config sit in that filesystem.
//
// The filesystem (squashfs) holds two entries at its root:
//
//	rootfs/       the image's layers, flattened: the guest's / (read-only,
//	              under an overlay whose writable layer is in guest memory)
//	config.json   a Config: what the image's OCI config says about how to
//	              run it
//
// Keeping the config beside rootfs/ rather than in it leaves the image's
// own tree exactly as its layers built it.
package imagefs

import (
	"encoding/json"
	"fmt"
	"os"
)

const (
	// RootDir is the directory holding the image's flattened tree.
	RootDir = "rootfs"
	// ConfigFile is the file holding the Config, as JSON.
	ConfigFile = "config.json"
	// MaxConfigBytes bounds config.json: the guest reads it, and the image
	// (the user's, so untrusted) wrote most of it.
	MaxConfigBytes = 1 << 20
)

// Config is the part of an OCI image config that says how to run it.
type Config struct {
	// Env is NAME=value entries: the defaults of the main process and of
	// every exec.
	Env []string `json:"env,omitempty"`
	// WorkingDir is the main process's and exec's default directory.
	WorkingDir string `json:"workingDir,omitempty"`
	// User is user[:group], by name or id, that the main process and
	// exec run as by default (empty: root).
	User string `json:"user,omitempty"`
	// Entrypoint and Cmd, joined, are the main process; none when both
	// are empty.
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	// Digest is the image's manifest digest (sha256:…), for logs.
	Digest string `json:"digest,omitempty"`
	// Reference is the reference the image was pulled by, for logs.
	Reference string `json:"reference,omitempty"`
}

// MainArgs is the main process's command line: Entrypoint then Cmd.
func (c Config) MainArgs() []string {
	return append(append([]string(nil), c.Entrypoint...), c.Cmd...)
}

// ReadConfig reads a Config, refusing one over MaxConfigBytes.
func ReadConfig(path string) (Config, error) {
	var c Config
	f, err := os.Open(path)
	if err != nil {
		return c, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return c, err
	}
	if fi.Size() > MaxConfigBytes {
		return c, fmt.Errorf("%s: %d bytes, more than %d", path, fi.Size(), MaxConfigBytes)
	}
	if err := json.NewDecoder(f).Decode(&c); err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}
