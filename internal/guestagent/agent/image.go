package agent

import (
	"errors"
	"fmt"
	"os/exec"
	"path"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/zyvor/kairon/internal/imagefs"
)

// An image guest (internal/imagefs): the guest's init mounts the image's
// tree, under an overlay, at a root in the initramfs, and the agent runs
// everything there: commands in a chroot, as the image's user, in its
// working directory, with its environment, the program found in the
// image's PATH; files read and written inside the root. The image may have
// no shell, no coreutils, no /etc/passwd: nothing here runs a program of
// the image's but the one asked for.

// DefaultPath is the PATH of a command in an image whose config sets none
// (Docker's default).
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Image is an image guest's root and what its config says about running
// things in it.
type Image struct {
	// Root is the directory the image's tree is mounted at (the overlay).
	Root   string
	Config imagefs.Config
}

// LoadImage is the image mounted at root, with its config read from
// configPath (imagefs.ConfigFile, beside the tree in the image).
func LoadImage(root, configPath string) (*Image, error) {
	if !path.IsAbs(root) {
		return nil, fmt.Errorf("image root %q: not an absolute path", root)
	}
	cfg, err := imagefs.ReadConfig(configPath)
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	return &Image{Root: path.Clean(root), Config: cfg}, nil
}

// Command is args run in the image: env are NAME=value entries over the
// image's (and win), dir the working directory (empty: the image's
// WorkingDir, else /), user user[:group] (empty: the image's User, else
// root). tty adds TERM. The command's Path is inside the root, where it
// runs (SysProcAttr.Chroot); a program not found in the image's PATH is an
// error wrapping exec.ErrNotFound.
func (img *Image) Command(args, env []string, dir, user string, tty bool) (*exec.Cmd, error) {
	if len(args) == 0 || args[0] == "" {
		return nil, errors.New("no program to run")
	}
	id, err := img.Identity(user)
	if err != nil {
		return nil, err
	}
	base := []string{"PATH=" + DefaultPath, "HOME=" + id.Home}
	if tty {
		base = append(base, "TERM=xterm")
	}
	fullEnv := mergeEnv(base, validEnv(img.Config.Env), env)
	if dir == "" {
		dir = img.Config.WorkingDir
	}
	if dir == "" || !path.IsAbs(dir) {
		dir = "/"
	}
	prog, err := lookPathInRoot(img.Root, args[0], envValue(fullEnv, "PATH"), dir)
	if err != nil {
		return nil, err
	}
	cmd := &exec.Cmd{Path: prog, Args: append([]string(nil), args...), Env: fullEnv, Dir: dir}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Chroot:     img.Root,
		Credential: &syscall.Credential{Uid: id.UID, Gid: id.GID, Groups: id.Groups},
	}
	return cmd, nil
}

// Identity is who user (user[:group]; empty: the image's User, else
// root) is in the image.
func (img *Image) Identity(user string) (Identity, error) {
	if user == "" {
		user = img.Config.User
	}
	acc, err := readAccounts(img.Root)
	if err != nil {
		return Identity{}, err
	}
	return acc.resolveUser(user)
}

// validEnv keeps the NAME=value entries of an image config's Env (the
// user's, so untrusted) that a process can take.
func validEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		name, _, ok := strings.Cut(kv, "=")
		if ok && name != "" && strings.IndexByte(kv, 0) < 0 {
			out = append(out, kv)
		}
	}
	return out
}

// mergeEnv joins lists of NAME=value entries: a later one replaces an
// earlier one of the same name in place.
func mergeEnv(lists ...[]string) []string {
	var out []string
	at := map[string]int{}
	for _, l := range lists {
		for _, kv := range l {
			name, _, _ := strings.Cut(kv, "=")
			if i, ok := at[name]; ok {
				out[i] = kv
				continue
			}
			at[name] = len(out)
			out = append(out, kv)
		}
	}
	return out
}

// envValue is name's value in env (the last entry wins).
func envValue(env []string, name string) string {
	v := ""
	for _, kv := range env {
		if n, val, ok := strings.Cut(kv, "="); ok && n == name {
			v = val
		}
	}
	return v
}

// lookPathInRoot finds the program file inside root as execve in a
// chroot at root would run it: a name with a slash as it is (relative to
// dir), any other in pathList's absolute directories (relative ones are
// ignored, as Go's LookPath ignores them). It returns the path inside the
// root.
func lookPathInRoot(root, file, pathList, dir string) (string, error) {
	if strings.Contains(file, "/") {
		p := file
		if !path.IsAbs(p) {
			p = path.Join(dir, p)
		}
		if err := executableInRoot(root, p); err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
				return "", fmt.Errorf("%s: no such program in the image: %w", file, exec.ErrNotFound)
			}
			return "", err
		}
		return p, nil
	}
	for d := range strings.SplitSeq(pathList, ":") {
		if !path.IsAbs(d) {
			continue
		}
		p := path.Join(d, file)
		if executableInRoot(root, p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q: no such program in the image's PATH (%s): %w", file, clipText(pathList, 512), exec.ErrNotFound)
}

// errNotExecutable: the file is there but is no program (a directory, or
// no execute bit).
var errNotExecutable = errors.New("not an executable file")

// executableInRoot checks that p, inside root, is a regular file with an
// execute bit.
func executableInRoot(root, p string) error {
	st, err := statInRoot(root, p)
	if err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o111 == 0 {
		return fmt.Errorf("%s: %w", p, errNotExecutable)
	}
	return nil
}

// clipText shortens s to n bytes for a message.
func clipText(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
