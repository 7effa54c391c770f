// Package tally counts what the members of a consumer group read and which partitions each
// holds, for both clients' checks: safe for the members' goroutines and callbacks.
package tally

import (
	"context"
	"sort"
	"strings"
	"sync"
	"time"
)

// Reads counts records by key: how many, how many distinct, how many read twice, and how many
// whose value does not start with the prefix this round expects.
type Reads struct {
	mu         sync.Mutex
	prefix     string
	keys       map[string]bool
	read       int
	duplicates int
	unexpected int
}

func NewReads(prefix string) *Reads {
	return &Reads{prefix: prefix, keys: map[string]bool{}}
}

// Add counts one record.
func (r *Reads) Add(key, value string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.read++
	if r.keys[key] {
		r.duplicates++
	}
	r.keys[key] = true
	if !strings.HasPrefix(value, r.prefix) {
		r.unexpected++
	}
}

// Distinct is the number of distinct keys read.
func (r *Reads) Distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.keys)
}

func (r *Reads) Summary() map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return map[string]any{"read": r.read, "distinct_keys": len(r.keys), "duplicates": r.duplicates,
		"unexpected": r.unexpected}
}

// Assignments is each member's current partitions of the one topic the group reads.
type Assignments struct {
	mu      sync.Mutex
	members []map[int32]bool
}

func NewAssignments(members int) *Assignments {
	found := &Assignments{members: make([]map[int32]bool, members)}
	for i := range found.members {
		found.members[i] = map[int32]bool{}
	}
	return found
}

// Set replaces member i's partitions (an eager rebalance hands out a whole new set).
func (a *Assignments) Set(i int, partitions []int32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.members[i] = map[int32]bool{}
	for _, p := range partitions {
		a.members[i][p] = true
	}
}

// Add gives member i more partitions (a cooperative rebalance adds to what it holds).
func (a *Assignments) Add(i int, partitions []int32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range partitions {
		a.members[i][p] = true
	}
}

// Remove takes partitions from member i.
func (a *Assignments) Remove(i int, partitions []int32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range partitions {
		delete(a.members[i], p)
	}
}

// Spread is true when every member holds a partition and the members hold each of the
// `partitions` exactly once.
func (a *Assignments) Spread(partitions int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	held := map[int32]int{}
	for _, member := range a.members {
		if len(member) == 0 && len(a.members) <= partitions {
			return false
		}
		for p := range member {
			held[p]++
		}
	}
	for p := int32(0); p < int32(partitions); p++ {
		if held[p] != 1 {
			return false
		}
	}
	return len(held) == partitions
}

// Sorted is each member's partitions in order.
func (a *Assignments) Sorted() [][]int32 {
	a.mu.Lock()
	defer a.mu.Unlock()
	found := make([][]int32, len(a.members))
	for i, member := range a.members {
		found[i] = []int32{}
		for p := range member {
			found[i] = append(found[i], p)
		}
		sort.Slice(found[i], func(x, y int) bool { return found[i][x] < found[i][y] })
	}
	return found
}

// WaitFor polls `done` every 10 ms until it holds or ctx ends; false on the deadline.
func WaitFor(ctx context.Context, done func() bool) bool {
	ticker := time.NewTicker(10 * time.Millisecond)
	defer ticker.Stop()
	for !done() {
		select {
		case <-ctx.Done():
			return done()
		case <-ticker.C:
		}
	}
	return true
}
