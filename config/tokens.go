package config

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// ErrTokenFile is returned when a token file cannot be used.
var ErrTokenFile = errors.New("token file")

// maxTokenFileSize bounds what ReadTokenFile reads: a token is one line.
const maxTokenFileSize = 4096

// ReadTokenFile reads a token from a file holding it on one line
// (surrounding white space and a trailing newline are ignored). Tokens are
// passed by file or environment rather than by flag, because flags show in
// `ps` to every user of the machine.
func ReadTokenFile(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrTokenFile, err)
	}
	if !fi.Mode().IsRegular() || fi.Size() > maxTokenFileSize {
		return "", fmt.Errorf("%w %s: want a regular file of at most %d bytes holding one token", ErrTokenFile, path, maxTokenFileSize)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrTokenFile, err)
	}
	tok := strings.TrimSpace(string(data))
	if tok == "" {
		return "", fmt.Errorf("%w %s is empty", ErrTokenFile, path)
	}
	if strings.ContainsAny(tok, "\r\n") {
		return "", fmt.Errorf("%w %s holds more than one line; it must hold just the token", ErrTokenFile, path)
	}
	return tok, nil
}

// tokenFromFile fills *token from file when file is set; setting both the
// token and its file is refused. name is the token's flag name.
func tokenFromFile(name string, token *string, file string) error {
	if file == "" {
		return nil
	}
	if *token != "" {
		return fmt.Errorf("%w: both %s and %s-file are set (flag, environment or config file): use one", ErrTokenFile, name, name)
	}
	tok, err := ReadTokenFile(file)
	if err != nil {
		return fmt.Errorf("%s-file: %w", name, err)
	}
	*token = tok
	return nil
}
