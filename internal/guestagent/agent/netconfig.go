package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// link sets up one network interface through rtnetlink. The agent used to
// run the guest's `ip` for each step; under TCG every program start costs
// tens of milliseconds, and a clone's configure took a third of a second.
type link struct {
	conn  *netlink.Conn
	index int32
	name  string
}

func openLink(ifname string) (*link, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w", ifname, err)
	}
	conn, err := netlink.Dial(unix.NETLINK_ROUTE, nil)
	if err != nil {
		return nil, fmt.Errorf("rtnetlink: %w", err)
	}
	return &link{conn: conn, index: int32(ifi.Index), name: ifname}, nil
}

func (l *link) Close() error { return l.conn.Close() }

func (l *link) execute(typ uint16, flags netlink.HeaderFlags, data []byte) ([]netlink.Message, error) {
	return l.conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(typ), Flags: netlink.Request | flags},
		Data:   data,
	})
}

// ifinfomsg is struct ifinfomsg: family, pad, type, index, flags, change.
func (l *link) ifinfomsg(flags, change uint32) []byte {
	b := make([]byte, unix.SizeofIfInfomsg)
	b[0] = unix.AF_UNSPEC
	binary.NativeEndian.PutUint32(b[4:], uint32(l.index))
	binary.NativeEndian.PutUint32(b[8:], flags)
	binary.NativeEndian.PutUint32(b[12:], change)
	return b
}

// setMAC gives the interface hardware address mac. virtio-net passes it
// to the device, which then filters on the new one.
func (l *link) setMAC(mac net.HardwareAddr) error {
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.IFLA_ADDRESS, Data: mac}})
	if err != nil {
		return err
	}
	if _, err := l.execute(unix.RTM_NEWLINK, netlink.Acknowledge, append(l.ifinfomsg(0, 0), attrs...)); err != nil {
		return fmt.Errorf("setting %s's address to %s: %w", l.name, mac, err)
	}
	return nil
}

func (l *link) up() error {
	if _, err := l.execute(unix.RTM_NEWLINK, netlink.Acknowledge, l.ifinfomsg(unix.IFF_UP, unix.IFF_UP)); err != nil {
		return fmt.Errorf("setting %s up: %w", l.name, err)
	}
	return nil
}

// addresses lists the interface's addresses as the kernel describes them
// (struct ifaddrmsg and its attributes), ready to be sent back as deletes.
func (l *link) addresses() ([][]byte, error) {
	req := make([]byte, unix.SizeofIfAddrmsg) // every family
	msgs, err := l.execute(unix.RTM_GETADDR, netlink.Dump, req)
	if err != nil {
		return nil, err
	}
	var out [][]byte
	for _, m := range msgs {
		if m.Header.Type != unix.RTM_NEWADDR || len(m.Data) < unix.SizeofIfAddrmsg {
			continue
		}
		if int32(binary.NativeEndian.Uint32(m.Data[4:8])) == l.index {
			out = append(out, m.Data)
		}
	}
	return out, nil
}

// flushAddresses removes every address of the interface. An address that
// is gone by the time its delete arrives (deleting a primary IPv4 address
// takes the secondaries of its subnet along) is not an error; the listing
// is repeated until it is empty.
func (l *link) flushAddresses() error {
	for range 4 {
		addrs, err := l.addresses()
		if err != nil {
			return fmt.Errorf("listing %s's addresses: %w", l.name, err)
		}
		if len(addrs) == 0 {
			return nil
		}
		for _, a := range addrs {
			if _, err := l.execute(unix.RTM_DELADDR, netlink.Acknowledge, a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
				return fmt.Errorf("removing an address of %s: %w", l.name, err)
			}
		}
	}
	return fmt.Errorf("%s keeps getting addresses while they are removed", l.name)
}

func family(a netip.Addr) uint8 {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// addAddress adds p (an address and its subnet's length), as `ip addr add`
// does.
func (l *link) addAddress(p netip.Prefix) error {
	a := p.Addr().Unmap()
	b := make([]byte, unix.SizeofIfAddrmsg)
	b[0] = family(a)
	b[1] = uint8(p.Bits())
	binary.NativeEndian.PutUint32(b[4:], uint32(l.index))
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.IFA_LOCAL, Data: a.AsSlice()},
		{Type: unix.IFA_ADDRESS, Data: a.AsSlice()},
	})
	if err != nil {
		return err
	}
	if _, err := l.execute(unix.RTM_NEWADDR, netlink.Acknowledge|netlink.Create|netlink.Excl, append(b, attrs...)); err != nil {
		return fmt.Errorf("adding %s to %s: %w", p, l.name, err)
	}
	return nil
}

// replaceDefaultRoute makes gw on this interface the default route of
// gw's family, in place of any other.
func (l *link) replaceDefaultRoute(gw netip.Addr) error {
	gw = gw.Unmap()
	b := make([]byte, unix.SizeofRtMsg)
	b[0] = family(gw) // destination 0/0
	b[4] = unix.RT_TABLE_MAIN
	b[5] = unix.RTPROT_BOOT
	b[6] = unix.RT_SCOPE_UNIVERSE
	b[7] = unix.RTN_UNICAST
	oif := make([]byte, 4)
	binary.NativeEndian.PutUint32(oif, uint32(l.index))
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.RTA_GATEWAY, Data: gw.AsSlice()},
		{Type: unix.RTA_OIF, Data: oif},
	})
	if err != nil {
		return err
	}
	if _, err := l.execute(unix.RTM_NEWROUTE, netlink.Acknowledge|netlink.Create|netlink.Replace, append(b, attrs...)); err != nil {
		return fmt.Errorf("default route via %s on %s: %w", gw, l.name, err)
	}
	return nil
}
