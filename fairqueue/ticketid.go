package fairqueue

import (
	"fmt"
	"strconv"
	"strings"
)

// TicketID names a ticket: "<node>:<counter>" (counter in base 36), or
// "<node>:<counter>:<flow>" in a fair queue. A ticket so names its owner
// node and its flow, and a store routes grants and orders flows without
// keeping them apart. The Redis scripts read it with the one helper
// ticket() in lua/common.lua.
type TicketID struct {
	// Node is the owner node's ID (Queue.Node).
	Node string
	// Counter numbers the node's tickets from 1.
	Counter uint64
	// Flow is the ticket's tenant key and priority band in a fair queue
	// ("<tenant key>.<band>"); "" in a FIFO queue.
	Flow string
}

// String returns the ID as stores and logs name the ticket.
func (id TicketID) String() string {
	s := id.Node + ":" + strconv.FormatUint(id.Counter, 36)
	if id.Flow != "" {
		s += ":" + id.Flow
	}
	return s
}

// ParseTicketID reads a ticket ID written by TicketID.String.
func ParseTicketID(s string) (TicketID, error) {
	node, rest, ok := strings.Cut(s, ":")
	if !ok || node == "" {
		return TicketID{}, fmt.Errorf("ticket ID %q: no node", s)
	}
	counter, flow, _ := strings.Cut(rest, ":")
	n, err := strconv.ParseUint(counter, 36, 64)
	if err != nil {
		return TicketID{}, fmt.Errorf("ticket ID %q: counter: %w", s, err)
	}
	return TicketID{Node: node, Counter: n, Flow: flow}, nil
}

// TicketNode returns the node that owns ticket (the ticket itself when it
// is not a ticket ID).
func TicketNode(ticket string) string {
	node, _, _ := strings.Cut(ticket, ":")
	return node
}

// TicketFlow returns the flow of ticket, "" in a FIFO queue.
func TicketFlow(ticket string) string {
	_, rest, _ := strings.Cut(ticket, ":")
	_, flow, _ := strings.Cut(rest, ":")
	return flow
}
