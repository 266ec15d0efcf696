"""What servers and clients share: access settings, connections, transfer, the data-directory layout."""
