// How problems reach a person: one action group that e-mails the operator, and two
// metric alerts on the Service Bus namespace.
//
//  * Dead-lettered messages on any queue (split by queue, so the e-mail names it):
//    an order that could not be submitted after its deliveries, or expired unread;
//    an agent request or response that kept failing. Nothing in a dead-letter queue
//    is processed again without an operator.
//  * Active messages on the alerts queue: the app put an operator alert there (an
//    order ended in Error: a step gave up after MAX_FAILURES expired attempts and
//    cannot be undone, or an undo failed; docs/workflows.md).
//
// Both auto-resolve once the queue is drained (the operator CLI reads both).

param actionGroupName string
param tags object = {}

@description('Operator e-mail address.')
param alertEmail string

param serviceBusNamespaceName string
param alertsQueueName string

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: serviceBusNamespaceName
}

resource operators 'Microsoft.Insights/actionGroups@2022-04-01' = {
  name: actionGroupName
  location: 'global'
  tags: tags
  properties: {
    groupShortName: 'sas-ops'
    enabled: true
    emailReceivers: [
      {
        name: 'operator'
        emailAddress: alertEmail
        useCommonAlertSchema: true
      }
    ]
  }
}

resource deadLetters 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: '${serviceBusNamespaceName}-dead-letters'
  location: 'global'
  tags: tags
  properties: {
    description: 'A Service Bus queue has dead-lettered messages. Inspect them with the operator CLI; they are not retried by themselves.'
    severity: 2
    enabled: true
    scopes: [
      namespace.id
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    autoMitigate: true
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'DeadLetteredMessages'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'DeadletteredMessages'
          // One alert per queue: '*' splits the series by queue name.
          dimensions: [
            {
              name: 'EntityName'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Maximum'
        }
      ]
    }
    actions: [
      {
        actionGroupId: operators.id
      }
    ]
  }
}

resource operatorAlerts 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: '${serviceBusNamespaceName}-operator-alerts'
  location: 'global'
  tags: tags
  properties: {
    description: 'The app raised an operator alert (an order ended in Error). Read it with the operator CLI; the order can be resubmitted.'
    severity: 1
    enabled: true
    scopes: [
      namespace.id
    ]
    evaluationFrequency: 'PT1M'
    windowSize: 'PT5M'
    autoMitigate: true
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'OperatorAlerts'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'ActiveMessages'
          dimensions: [
            {
              name: 'EntityName'
              operator: 'Include'
              values: [
                alertsQueueName
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Maximum'
        }
      ]
    }
    actions: [
      {
        actionGroupId: operators.id
      }
    ]
  }
}

output actionGroupName string = operators.name
