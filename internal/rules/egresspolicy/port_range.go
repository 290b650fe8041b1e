package egresspolicy

import (
	"fmt"
	"strconv"
	"strings"
)

// PortRange is an inclusive range of destination ports.
type PortRange struct{ Lo, Hi uint16 }

func (p PortRange) String() string {
	if p.Lo == p.Hi {
		return strconv.Itoa(int(p.Lo))
	}
	return fmt.Sprintf("%d-%d", p.Lo, p.Hi)
}

func parsePort(s string) (PortRange, error) {
	lo, hi, isRange := strings.Cut(s, "-")
	if !isRange {
		hi = lo
	}
	l, err1 := strconv.ParseUint(lo, 10, 16)
	h, err2 := strconv.ParseUint(hi, 10, 16)
	if err1 != nil || err2 != nil || l < 1 || h < l {
		return PortRange{}, fmt.Errorf("%q is not a port N or a range N-M with 1 <= N <= M <= 65535", s)
	}
	return PortRange{uint16(l), uint16(h)}, nil
}

// mergePorts joins overlapping and adjacent ranges of a sorted list: nft
// refuses overlapping elements in one anonymous interval set.
func mergePorts(ps []PortRange) []PortRange {
	var out []PortRange
	for _, p := range ps {
		if n := len(out); n > 0 && int(p.Lo) <= int(out[n-1].Hi)+1 {
			out[n-1].Hi = max(out[n-1].Hi, p.Hi)
			continue
		}
		out = append(out, p)
	}
	return out
}
