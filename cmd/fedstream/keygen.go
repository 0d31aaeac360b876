package main

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fedstream/fedstream/config"
)

// gossipKeyBytes is the size of the keys keygen makes (AES-256).
const gossipKeyBytes = 32

func newKeygenCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "keygen",
		Short: "Print a new gossip encryption key (base64, 32 bytes)",
		Long: `keygen prints a new random 32-byte key, base64 encoded, for the serf gossip of
an org's coordinators. Give every coordinator of the org the same key, by file
(--gossip-key-file) or environment (FEDSTREAM_GOSSIP_KEY) rather than on the
command line, where ps shows it.`,
		Example: "  fedstream keygen > examples/org/tls/gossip.key",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			key, err := newGossipKey()
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), base64.StdEncoding.EncodeToString(key))
			return nil
		},
	}
}

func newGossipKey() ([]byte, error) {
	key := make([]byte, gossipKeyBytes)
	_, err := rand.Read(key)
	return key, err
}

// gossipKey reads a coordinator's gossip key from its file or value.
func gossipKey(c *config.Coordinator) ([]byte, error) {
	v := c.GossipKey
	src := "gossip-key"
	if c.GossipKeyFile != "" {
		if v != "" {
			return nil, errors.New("give --gossip-key-file or --gossip-key, not both")
		}
		data, err := os.ReadFile(c.GossipKeyFile)
		if err != nil {
			return nil, fmt.Errorf("gossip key: %w", err)
		}
		v, src = string(data), c.GossipKeyFile
	}
	v = strings.TrimSpace(v)
	if v == "" {
		return nil, nil
	}
	key, err := base64.StdEncoding.DecodeString(v)
	if err != nil {
		return nil, fmt.Errorf("gossip key in %s is not base64 (fedstream keygen makes one): %w", src, err)
	}
	return key, nil
}

// federationKeyring reads the federation pool's gossip key from
// federation.keyring-file or federation.keyring (base64).
func federationKeyring(c *config.Coordinator) ([]byte, error) {
	v, src := c.Federation.Keyring, "federation.keyring"
	if f := c.Federation.KeyringFile; f != "" {
		if v != "" {
			return nil, errors.New("give federation.keyring-file or federation.keyring, not both")
		}
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("federation keyring: %w", err)
		}
		v, src = string(data), f
	}
	v = strings.TrimSpace(v)
	if v == "" {
		return nil, nil
	}
	key, err := base64.StdEncoding.DecodeString(v)
	if err != nil {
		return nil, fmt.Errorf("federation keyring in %s is not base64 (fedstream keygen makes one): %w", src, err)
	}
	return key, nil
}
