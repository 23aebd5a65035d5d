// App Service Authentication ("Easy Auth") in front of the status API (api/): only a
// caller with a valid Microsoft Entra ID token for the API's app registration reaches
// the app; any other request gets 401 from the platform, before a function runs.
//
// The app registration itself is not made here: plain Bicep cannot create one (it is
// a Microsoft Graph object, not an Azure resource). docs/deploy.md creates it, with its
// two app roles, and passes its client id as apiClientId. Easy Auth checks the token
// (issuer, audience, signature, lifetime) but not the caller's app roles: the functions
// do (core/access.py), from the X-MS-CLIENT-PRINCIPAL header Easy Auth sets, with the
// app setting API_AUTH=easyauth (resources.bicep sets it whenever this module deploys).

param functionAppName string

@description('Application (client) id of the status API\'s Entra ID app registration (docs/deploy.md).')
param apiClientId string

resource app 'Microsoft.Web/sites@2024-04-01' existing = {
  name: functionAppName
}

resource auth 'Microsoft.Web/sites/config@2024-04-01' = {
  parent: app
  name: 'authsettingsV2'
  properties: {
    platform: {
      enabled: true
    }
    globalValidation: {
      // Every request needs a token; an API caller gets 401, not a login redirect.
      requireAuthentication: true
      unauthenticatedClientAction: 'Return401'
    }
    httpSettings: {
      requireHttps: true
    }
    identityProviders: {
      azureActiveDirectory: {
        enabled: true
        registration: {
          clientId: apiClientId
          // The v2.0 issuer of this tenant (the app registration asks for v2 tokens).
          openIdIssuer: '${environment().authentication.loginEndpoint}${tenant().tenantId}/v2.0'
        }
        validation: {
          // A v2 token's audience is the client id (always allowed); a v1 token's the
          // Application ID URI.
          allowedAudiences: [
            apiClientId
            'api://${apiClientId}'
          ]
        }
      }
    }
    login: {
      // Callers present bearer tokens; nothing to keep between requests.
      tokenStore: {
        enabled: false
      }
    }
  }
}
