import SluiceCore

extension NodeReader {
    /// `fleet.cache: { advertise: IP:PORT, secret: ${SLUICE_FLEET_SECRET}, listen: IP:PORT,
    /// weight: 1, peers: [{ address: IP:PORT, weight: 1 }] }` (docs/fleet.md, "One cache
    /// across the fleet"). `hasRedis`: without Redis the members are the static `peers`, which
    /// are then required.
    mutating func readFleetCache(_ node: YAMLNode, hasRedis: Bool) -> FleetCacheSettings? {
        var advertise: String?
        var secret: Secret?
        var listen: String?
        var weight: Double?
        var peers: [FleetCacheSettings.Peer] = []
        let known = ["advertise", "secret", "listen", "weight", "peers"]
        entries(node, in: "fleet.cache", known: known) { r, key, value in
            switch key {
            case "advertise":
                advertise = r.peerAddress(value, what: "fleet.cache.advertise")
                r.fleetAdvertiseNode = value
            case "secret": secret = r.secret(value, what: "fleet.cache.secret")
            case "listen":
                listen = r.peerAddress(value, what: "fleet.cache.listen")
                if let listen { r.listenNodes.append((listen, value)) }
            case "weight": weight = r.peerWeight(value, what: "fleet.cache.weight")
            default: peers = r.fleetPeers(value)
            }
        }
        guard case .mapping = node else { return nil }
        if advertise == nil && node["advertise"] == nil {
            fail(node, "fleet.cache needs advertise: the IP:port its peers reach this instance on")
        }
        if secret == nil && node["secret"] == nil {
            fail(node, "fleet.cache needs secret: the fleet's shared secret, e.g. ${SLUICE_FLEET_SECRET}")
        }
        if let value = secret?.value, value.utf8.count < 16 {
            fail(node["secret"], "fleet.cache.secret must be at least 16 bytes long")
        }
        if !hasRedis && peers.isEmpty {
            fail(node, "fleet.cache needs peers: (every instance of the fleet) when fleet has no redis")
        }
        guard let advertise, let secret else { return nil }
        var settings = FleetCacheSettings(advertise: advertise, secret: secret)
        settings.listen = listen
        settings.weight = weight ?? FleetCacheSettings.defaultWeight
        settings.peers = peers
        if let own = peers.first(where: { $0.address == advertise }), own.weight != settings.weight {
            fail(
                node["peers"], "fleet.cache.peers: this instance's entry (\(advertise)) must have its weight (\(settings.weight))"
            )
        }
        return settings
    }

    /// Peers reach this instance on `advertise`: its port is the peer listener's
    /// (`fleet.cache.listen`) or, without one, a forward listener's (`listen:`). (The address
    /// itself may differ: a listener on `0.0.0.0`, or an address the others route to.)
    mutating func checkFleetAdvertise(_ server: ServerConfiguration) {
        guard let cache = server.fleetCache, let node = fleetAdvertiseNode else { return }
        let port = Self.port(cache.advertise)
        if let listen = cache.listen {
            if Self.port(listen) != port {
                fail(
                    node,
                    "fleet.cache.advertise (\(cache.advertise)) must have the port of fleet.cache.listen (\(listen)): "
                        + "peers reach this instance on advertise, which must lead to the peer listener")
            }
        } else if !server.listen.contains(where: { Self.port($0) == port }) {
            fail(
                node,
                "fleet.cache.advertise (\(cache.advertise)) must have the port of one of the listen addresses "
                    + "(\(server.listen.joined(separator: ", "))), or set fleet.cache.listen: peers reach this instance on advertise"
            )
        }
    }

    private static func port(_ address: String) -> Substring {
        address[address.index(after: address.lastIndex(of: ":")!)...]
    }

    /// `peers: [{ address: IP:PORT, weight: 1 }]`: each address once.
    private mutating func fleetPeers(_ node: YAMLNode) -> [FleetCacheSettings.Peer] {
        guard case .sequence(let items) = node else {
            fail(node, "fleet.cache.peers must be a list of { address: IP:port, weight: N }")
            return []
        }
        var peers: [FleetCacheSettings.Peer] = []
        for item in items {
            var address: String?
            var weight: Double?
            entries(item, in: "fleet.cache.peers", known: ["address", "weight"]) { r, key, value in
                if key == "address" {
                    address = r.peerAddress(value, what: "fleet.cache.peers.address")
                } else {
                    weight = r.peerWeight(value, what: "fleet.cache.peers.weight")
                }
            }
            if case .mapping = item, item["address"] == nil {
                fail(item, "fleet.cache.peers: each entry needs address: IP:port")
            }
            guard let address else { continue }
            if peers.contains(where: { $0.address == address }) {
                fail(item, "fleet.cache.peers: \(address) is listed twice")
                continue
            }
            peers.append(FleetCacheSettings.Peer(address: address, weight: weight ?? FleetCacheSettings.defaultWeight))
        }
        return peers
    }

    /// A numeric `IP:port` (`[v6]:port`): peers never depend on DNS.
    private mutating func peerAddress(_ node: YAMLNode, what: String) -> String? {
        guard let text = node.scalar?.string, ListenAddress.isValid(text) else {
            fail(node, "\(what) must be an IP:port such as 10.0.0.5:3128 or [fd00::5]:3128")
            return nil
        }
        return text
    }

    /// A weight above 0, at most `FleetCacheSettings.maximumWeight`.
    private mutating func peerWeight(_ node: YAMLNode, what: String) -> Double? {
        guard let text = node.scalar?.string, let weight = Double(text), weight > 0,
            weight <= FleetCacheSettings.maximumWeight
        else {
            fail(node, "\(what) must be a number above 0 and at most \(Int(FleetCacheSettings.maximumWeight))")
            return nil
        }
        return weight
    }
}
