package network

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"
)

// AnnounceGateway sends a gratuitous ARP on the bridge saying that addr is
// at the bridge's own MAC. A guest that migrated to another node leaves
// behind guests of its old bridge that cached its MAC: they would go on
// sending to a MAC no port has any more until their entry expires (half a
// minute and more). The announcement points them at the node, which routes
// the address to the guest's new node; Linux updates an entry it has on
// such an ARP, and creates none.
func AnnounceGateway(netns, bridge string, addr netip.Addr) error {
	if !addr.Is4() {
		return fmt.Errorf("gratuitous ARP for %v: not IPv4", addr)
	}
	mac, err := net.ParseMAC(BridgeMAC(bridge))
	if err != nil {
		return err
	}
	frame := make([]byte, 42)
	copy(frame[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(frame[6:12], mac)
	binary.BigEndian.PutUint16(frame[12:14], unix.ETH_P_ARP)
	binary.BigEndian.PutUint16(frame[14:16], 1) // Ethernet
	binary.BigEndian.PutUint16(frame[16:18], unix.ETH_P_IP)
	frame[18], frame[19] = 6, 4
	binary.BigEndian.PutUint16(frame[20:22], 1) // request, sender = target: gratuitous
	ip := addr.As4()
	copy(frame[22:28], mac)
	copy(frame[28:32], ip[:])
	copy(frame[38:42], ip[:])
	return InNamespace(netns, func() error {
		iface, err := net.InterfaceByName(bridge)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return fmt.Errorf("gratuitous ARP on %s: %w", bridge, err)
		}
		defer unix.Close(fd)
		to := &unix.SockaddrLinklayer{Protocol: arpProtocol, Ifindex: iface.Index, Halen: 6}
		copy(to.Addr[:], frame[0:6])
		if err := unix.Sendto(fd, frame, 0, to); err != nil {
			return fmt.Errorf("gratuitous ARP on %s: %w", bridge, err)
		}
		return nil
	})
}

// arpProtocol is ETH_P_ARP in network byte order, as a packet socket wants it.
const arpProtocol = unix.ETH_P_ARP<<8&0xff00 | unix.ETH_P_ARP>>8
