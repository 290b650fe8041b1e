package network

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"sync"
)

// IPAM hands out addresses of one IPv4 network and remembers them in a file,
// so an agent restart keeps every Machine's address.
//
// The first address of the network is the gateway (the bridge); the network
// and broadcast addresses are never handed out. New addresses come from the
// pool, a part of the network (all of it by default): agents that share one
// network (kairon-local's nodes on one bridge) each get their own pool, and
// a guest migrated from another node keeps its address from that node's pool.
type IPAM struct {
	mu     sync.Mutex
	prefix netip.Prefix
	pool   netip.Prefix
	file   string
	byID   map[string]netip.Addr
	// held are ids whose VM left this node while their Machine may still
	// have the address (a guest migrated or recovered elsewhere keeps it):
	// the address stays out of this node's pool until ReleaseUnheld finds
	// that the cluster no longer shows it.
	held map[string]bool
	// Taken, when set, tells whether an address belongs to a Machine other
	// than id elsewhere in the cluster (a guest that migrated away from
	// this node keeps its address there): such an address is handed to no
	// one here. Set it before the first allocation.
	Taken func(id string, addr netip.Addr) bool
	// Ready, when set, must return nil before an address is assigned for
	// the first time: Taken knows nothing until it has looked at the
	// cluster once. Ids already holding an address get it all the same.
	Ready func() error
}

type ipamState struct {
	Prefix      string            `json:"prefix"`
	Allocations map[string]string `json:"allocations"`
	// Held lists the allocations kept for a Machine whose VM left (Hold).
	Held []string `json:"held,omitempty"`
}

// NewIPAM loads the allocations kept in file, or starts empty. A file written
// for a different prefix is an error: silently re-addressing running guests
// would break them.
// A zero pool is the whole network.
func NewIPAM(prefix, pool netip.Prefix, file string) (*IPAM, error) {
	prefix = prefix.Masked()
	if !prefix.Addr().Is4() || prefix.Bits() > 29 {
		return nil, fmt.Errorf("network range %s: need an IPv4 prefix of /29 or larger", prefix)
	}
	if !pool.IsValid() {
		pool = prefix
	}
	pool = pool.Masked()
	if !prefix.Contains(pool.Addr()) || pool.Bits() < prefix.Bits() {
		return nil, fmt.Errorf("address pool %s is not inside the network %s", pool, prefix)
	}
	ipam := &IPAM{prefix: prefix, pool: pool, file: file, byID: map[string]netip.Addr{}, held: map[string]bool{}}
	data, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return ipam, nil
	}
	if err != nil {
		return nil, err
	}
	var state ipamState
	if err := json.Unmarshal(data, &state); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if state.Prefix != prefix.String() {
		return nil, fmt.Errorf("%s holds addresses from %s, not %s: stop the Machines on this node or keep the old --network-cidr", file, state.Prefix, prefix)
	}
	for id, s := range state.Allocations {
		addr, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", file, id, err)
		}
		ipam.byID[id] = addr
	}
	for _, id := range state.Held {
		if _, ok := ipam.byID[id]; ok {
			ipam.held[id] = true
		}
	}
	return ipam, nil
}

// Gateway is the node side of the range: the bridge's address.
func (a *IPAM) Gateway() netip.Prefix {
	return netip.PrefixFrom(a.prefix.Addr().Next(), a.prefix.Bits())
}

// Allocate returns id's address, assigning the lowest free one the first time.
func (a *IPAM) Allocate(id string) (netip.Prefix, error) {
	return a.AllocatePreferring(id, netip.Addr{})
}

// AllocatePreferring is Allocate, but a first assignment takes preferred if
// it is a free guest address of the network, even outside the pool. A
// migrated guest keeps the address configured inside it this way, wherever
// the networks agree.
func (a *IPAM) AllocatePreferring(id string, preferred netip.Addr) (netip.Prefix, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if addr, ok := a.byID[id]; ok {
		if a.held[id] {
			// Its VM is back on this node: the address is in use again.
			delete(a.held, id)
			if err := a.save(); err != nil {
				a.held[id] = true
				return netip.Prefix{}, err
			}
		}
		return netip.PrefixFrom(addr, a.prefix.Bits()), nil
	}
	if a.Ready != nil {
		if err := a.Ready(); err != nil {
			return netip.Prefix{}, err
		}
	}
	used := map[netip.Addr]bool{}
	for _, addr := range a.byID {
		used[addr] = true
	}
	candidates := func(yield func(netip.Addr) bool) {
		if a.guestAddress(preferred) && !yield(preferred) {
			return
		}
		for addr := a.pool.Addr(); a.pool.Contains(addr); addr = addr.Next() {
			// A pool's own first and last addresses (x.y.z.0 and .255 for a
			// /24) are valid in a larger network but confuse people and
			// some software; they are skipped.
			if addr == a.pool.Addr() || !a.pool.Contains(addr.Next()) {
				continue
			}
			if a.guestAddress(addr) && !yield(addr) {
				return
			}
		}
	}
	for addr := range candidates {
		if used[addr] || (a.Taken != nil && a.Taken(id, addr)) {
			continue
		}
		a.byID[id] = addr
		if err := a.save(); err != nil {
			delete(a.byID, id)
			return netip.Prefix{}, err
		}
		return netip.PrefixFrom(addr, a.prefix.Bits()), nil
	}
	return netip.Prefix{}, fmt.Errorf("address pool %s is full (%d addresses in use)", a.pool, len(a.byID))
}

// guestAddress tells whether addr may be handed to a guest: in the range,
// and neither the network, the gateway nor the broadcast address.
func (a *IPAM) guestAddress(addr netip.Addr) bool {
	return addr.IsValid() && a.prefix.Contains(addr) && a.prefix.Contains(addr.Next()) &&
		addr != a.prefix.Addr() && addr != a.Gateway().Addr()
}

// Release frees id's address; releasing an unknown id does nothing.
func (a *IPAM) Release(id string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.byID[id]; !ok {
		return nil
	}
	delete(a.byID, id)
	delete(a.held, id)
	return a.save()
}

// Hold keeps id's address allocated although its VM left this node: the
// Machine may still have it elsewhere (a migrated guest keeps its
// address), and handing it to a new VM here would give two guests one
// address. ReleaseUnheld frees it once the cluster shows it free. Holding
// an unknown id does nothing.
func (a *IPAM) Hold(id string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.byID[id]; !ok || a.held[id] {
		return nil
	}
	a.held[id] = true
	if err := a.save(); err != nil {
		delete(a.held, id)
		return err
	}
	return nil
}

// Held lists the held ids and their addresses.
func (a *IPAM) Held() map[string]netip.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	held := make(map[string]netip.Addr, len(a.held))
	for id := range a.held {
		held[id] = a.byID[id]
	}
	return held
}

// ReleaseUnheld frees each held address for which stillHeld(id, address)
// is false, and returns the ids it freed.
func (a *IPAM) ReleaseUnheld(stillHeld func(id string, addr netip.Addr) bool) ([]string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var freed []string
	for id := range a.held {
		if !stillHeld(id, a.byID[id]) {
			freed = append(freed, id)
		}
	}
	if len(freed) == 0 {
		return nil, nil
	}
	sort.Strings(freed)
	for _, id := range freed {
		delete(a.held, id)
		delete(a.byID, id)
	}
	return freed, a.save()
}

// Lookup returns id's address if its VM has one on this node, without
// assigning any: an address held for a guest that left does not count.
func (a *IPAM) Lookup(id string) (netip.Addr, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	addr, ok := a.byID[id]
	return addr, ok && !a.held[id]
}

// Allocated lists the ids holding an address, sorted.
func (a *IPAM) Allocated() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	ids := make([]string, 0, len(a.byID))
	for id := range a.byID {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func (a *IPAM) save() error {
	state := ipamState{Prefix: a.prefix.String(), Allocations: map[string]string{}}
	for id, addr := range a.byID {
		state.Allocations[id] = addr.String()
	}
	for id := range a.held {
		state.Held = append(state.Held, id)
	}
	sort.Strings(state.Held)
	data, err := json.MarshalIndent(state, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(a.file), 0o755); err != nil {
		return err
	}
	tmp := a.file + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, a.file)
}
