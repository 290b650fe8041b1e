package controlplane

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/zyvor/kairon/internal/localport"
)

// ports are chosen once per data dir and recorded in config.json: etcd's
// member record holds its peer URL and the kubeconfig holds the API server
// URL, so moving them on every start would break both.
type ports struct {
	APIServer  int `json:"apiServerPort"`
	EtcdClient int `json:"etcdClientPort"`
	EtcdPeer   int `json:"etcdPeerPort"`
}

func readPorts(file string) (ports, bool, error) {
	var p ports
	data, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return p, false, nil
	}
	if err != nil {
		return p, false, err
	}
	if err := json.Unmarshal(data, &p); err != nil {
		return p, false, fmt.Errorf("%s is damaged (%v): delete it to choose new ports", file, err)
	}
	return p, true, nil
}

func writePorts(file string, p ports) error {
	data, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(file, append(data, '\n'), 0o644)
}

// choosePorts settles the three ports for this start: an explicit API server
// port wins, then what the data dir recorded, then the preferred port if it
// is free, then any free port.
func choosePorts(file string, apiServerPort, preferredPort int) (ports, error) {
	p, recorded, err := readPorts(file)
	if err != nil {
		return p, err
	}
	if apiServerPort != 0 {
		p.APIServer = apiServerPort
	} else if !recorded || p.APIServer == 0 {
		p.APIServer = 0
		if preferredPort != 0 && portFree(preferredPort) {
			p.APIServer = preferredPort
		}
	}
	taken := []int{p.APIServer, p.EtcdClient, p.EtcdPeer}
	for _, slot := range []*int{&p.APIServer, &p.EtcdClient, &p.EtcdPeer} {
		if *slot != 0 {
			continue
		}
		port, err := freePort(taken)
		if err != nil {
			return p, err
		}
		*slot = port
		taken = append(taken, port)
	}
	return p, nil
}

// checkPorts fails before any process starts, so a clash is reported in
// words instead of as a bind error buried in a child's log.
func checkPorts(p ports, configFile string) error {
	if p.APIServer == p.EtcdClient || p.APIServer == p.EtcdPeer {
		return fmt.Errorf("port %d is etcd's in this data dir (see %s): pass another --port", p.APIServer, configFile)
	}
	if !portFree(p.APIServer) {
		return fmt.Errorf("port %d on 127.0.0.1 is already in use: stop what holds it or pass --port", p.APIServer)
	}
	for _, c := range []struct {
		name string
		port int
	}{{"etcd client", p.EtcdClient}, {"etcd peer", p.EtcdPeer}} {
		if !portFree(c.port) {
			return fmt.Errorf("%s port %d on 127.0.0.1 (recorded in %s) is already in use: stop what holds it", c.name, c.port, configFile)
		}
	}
	return nil
}

func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// freePort is a port for one of the control plane's listeners, below the
// ephemeral range (localport says why).
func freePort(avoid []int) (int, error) { return localport.Free(avoid) }

// dataDirLock is an flock on DataDir/lock. The kernel drops it when the
// process dies, however it dies, so a crash never leaves a stale lock.
type dataDirLock struct{ f *os.File }

func lockDataDir(dir string) (*dataDirLock, error) {
	name := filepath.Join(dir, "lock")
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			holder := "unknown"
			if b, err := os.ReadFile(name); err == nil && strings.TrimSpace(string(b)) != "" {
				holder = strings.TrimSpace(string(b))
			}
			return nil, fmt.Errorf("another kairon-local is running with data dir %s (pid %s): stop it first or choose another --data-dir", dir, holder)
		}
		return nil, fmt.Errorf("locking %s: %w", name, err)
	}
	// The pid is only for the message above; the flock is what excludes.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &dataDirLock{f: f}, nil
}

func (l *dataDirLock) release() {
	if l == nil || l.f == nil {
		return
	}
	_ = l.f.Truncate(0)
	_ = syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
	_ = l.f.Close()
	l.f = nil
}
