package main

import "strconv"

// plural is n with the noun for n of them: "1 partition", "0 partitions",
// "4 partitions". many is the plural, given whole (entries, replicas).
func plural(n int, one, many string) string {
	if n == 1 || n == -1 {
		return strconv.Itoa(n) + " " + one
	}
	return strconv.Itoa(n) + " " + many
}
