namespace Tern.Proxy.Configuration;

/// <summary>The configuration in force: the last one that passed every check.</summary>
public sealed class ActiveConfiguration(ConfigurationSnapshot initial)
{
    private volatile ConfigurationSnapshot _current = initial;

    public ConfigurationSnapshot Current => _current;

    internal void Replace(ConfigurationSnapshot snapshot) => _current = snapshot;
}
