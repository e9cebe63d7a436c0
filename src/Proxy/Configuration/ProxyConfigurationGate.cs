using Microsoft.Extensions.Configuration;

namespace Tern.Proxy.Configuration;

/// <summary>
/// The configuration YARP reads its routes and clusters from: a copy of the live "ReverseProxy"
/// section that is only updated once the whole configuration has passed Tern's checks, so an
/// invalid edit never reaches YARP and the last good routes stay in force. YARP still parses it
/// with its own reader and runs its own validation on top.
/// </summary>
internal sealed class ProxyConfigurationGate : ConfigurationProvider, IConfigurationSource
{
    private readonly ChildKeyIndex _index = new();

    public ProxyConfigurationGate() => Root = new ConfigurationRoot([this]);

    public IConfigurationRoot Root { get; }

    public IConfigurationProvider Build(IConfigurationBuilder builder) => this;

    public void Publish(IEnumerable<KeyValuePair<string, string?>> data)
    {
        Data = new Dictionary<string, string?>(data, StringComparer.OrdinalIgnoreCase);
        OnReload();
    }

    /// <summary>Indexed: YARP reads every route and cluster through these (see ChildKeyIndex).</summary>
    public override IEnumerable<string> GetChildKeys(IEnumerable<string> earlierKeys, string? parentPath) =>
        _index.ChildKeys(Data, earlierKeys, parentPath);
}
